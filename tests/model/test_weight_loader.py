"""The per-parameter weight_loader seam (tram/model/weight_utils.py) and the loading loop around it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hf_models import make_hf_model_dir
from safetensors.torch import load_file, save_file

from tram.model.loader import get_hf_config, load_safetensors_weights, safetensors_files
from tram.model.registry import get_model_class
from tram.model.weight_utils import (
    WeightShapeError,
    default_weight_loader,
    get_weight_loader,
    materialize,
    set_weight_loader,
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_hf_model_dir(tmp_path_factory.mktemp("wl"), "llama_untied")


def _empty_model(path: str) -> torch.nn.Module:
    hf_config = get_hf_config(path)
    with torch.device("meta"):
        model = get_model_class(hf_config.architectures[0])(hf_config, torch.float32, "torch")
    materialize(model, "cpu")
    return model


def test_default_loader_copies_and_casts_or_names_both_shapes() -> None:
    param = torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.bfloat16), requires_grad=False)
    default_weight_loader(param, torch.arange(6, dtype=torch.float32).view(2, 3))
    assert param.dtype == torch.bfloat16 and torch.equal(param.float(), torch.arange(6.0).view(2, 3))
    with pytest.raises(WeightShapeError, match=r"has shape \(3, 2\), the model expects \(2, 3\)"):
        default_weight_loader(param, torch.zeros(3, 2))
    assert get_weight_loader(param) is default_weight_loader


def test_materialize_keeps_weight_loaders_that_to_empty_drops() -> None:
    with torch.device("meta"):
        layer = torch.nn.Linear(4, 2)
    calls: list[tuple[int, ...]] = []
    set_weight_loader(layer.weight, lambda p, t: calls.append(tuple(t.shape)))
    materialize(layer, "cpu")
    assert layer.weight.device.type == "cpu" and layer.bias.device.type == "cpu"
    get_weight_loader(layer.weight)(layer.weight, torch.zeros(2, 4))
    assert calls == [(2, 4)]
    assert get_weight_loader(layer.bias) is default_weight_loader


def test_each_tensor_goes_through_its_parameters_loader(llama_dir: str) -> None:
    """A custom loader receives the checkpoint tensor and decides what the parameter holds."""
    model = _empty_model(llama_dir)
    name = "model.layers.1.mlp.up_proj.weight"
    param = dict(model.named_parameters())[name]
    seen: list[torch.Tensor] = []

    def doubling_loader(p: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        seen.append(loaded.clone())
        p.copy_(2 * loaded)

    set_weight_loader(param, doubling_loader)
    files = safetensors_files(llama_dir)
    load_safetensors_weights(model, files, tied=False)
    checkpoint = load_file(files[0])
    assert len(seen) == 1 and torch.equal(seen[0], checkpoint[name])
    assert torch.equal(param, 2 * checkpoint[name])
    other = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(dict(model.named_parameters())[other], checkpoint[other])


def test_loader_errors_name_the_weight_and_file(llama_dir: str, tmp_path: Path) -> None:
    model = _empty_model(llama_dir)
    param = dict(model.named_parameters())["model.norm.weight"]

    def refusing_loader(p: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        raise ValueError("packed format not understood")

    set_weight_loader(param, refusing_loader)
    with pytest.raises(ValueError, match=r"Weight model\.norm\.weight in .*model\.safetensors: packed format"):
        load_safetensors_weights(model, safetensors_files(llama_dir), tied=False)

    folder = tmp_path / "bad_shape"
    shutil.copytree(llama_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(7, 64)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"Weight model\.layers\.0\.self_attn\.k_proj\.weight has shape \(7, 64\) "
        r"in .*model\.safetensors, the model expects \(32, 64\)",
    ):
        load_safetensors_weights(_empty_model(str(folder)), safetensors_files(str(folder)), tied=False)
