"""The transformers config the engine sends its workers as plain data (config/hf_snapshot.py): it
answers what the config answers, and a process unpickles it without importing transformers."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import transformers
from conftest import STORIES
from hf_models import _BASE, KINDS

from tram.config.hf_snapshot import HFConfigSnapshot, snapshot_hf_config
from tram.config.model import ModelConfig, load_hf_config


def _configs() -> dict[str, object]:
    configs = {kind: getattr(transformers, cls)(**{**_BASE, **overrides}) for kind, (cls, overrides) in KINDS.items()}
    configs["stories260K"] = load_hf_config(STORIES)
    return configs


CONFIGS = _configs()


def _public_names(config: object) -> set[str]:
    return {n for n in vars(config) if not n.startswith("_")} | set(getattr(type(config), "attribute_map", {}))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_snapshot_answers_what_the_config_answers(name: str) -> None:
    config = CONFIGS[name]
    snap = snapshot_hf_config(config)
    for attr in _public_names(config):
        value = getattr(config, attr)
        if type(value).__module__.startswith("transformers"):
            continue  # views over the config, left out on purpose
        assert getattr(snap, attr) == value, attr
    assert snap.get_text_config() is snap
    with pytest.raises(AttributeError):
        snap.no_such_field  # noqa: B018 - getattr(config, name, default) must see it missing


def test_a_multimodal_config_keeps_its_text_config() -> None:
    text = transformers.Gemma3TextConfig(**{**_BASE, **KINDS["gemma3"][1]})
    config = transformers.Gemma3Config(text_config=text.to_dict())
    snap = snapshot_hf_config(config)
    assert isinstance(snap.text_config, HFConfigSnapshot)
    assert snap.get_text_config() is snap.text_config
    assert snap.get_text_config().sliding_window == config.get_text_config().sliding_window
    assert snap.get_text_config().layer_types == config.get_text_config().layer_types
    assert snap.to_dict()["text_config"]["hidden_size"] == text.hidden_size


def test_a_quantization_config_object_becomes_its_dict() -> None:
    config = transformers.LlamaConfig(**_BASE)
    config.quantization_config = transformers.GPTQConfig(bits=4, group_size=32)
    snap = snapshot_hf_config(config)
    assert isinstance(snap.quantization_config, dict)
    assert snap.quantization_config["quant_method"] == "gptq" and snap.quantization_config["group_size"] == 32


def test_a_worker_unpickles_it_without_transformers() -> None:
    model_config = ModelConfig(STORIES).for_workers()
    assert isinstance(model_config.hf_config, HFConfigSnapshot)
    script = (
        "import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); "
        "print(c.hf_config.hidden_size, c.hf_config.rope_parameters['rope_theta'], "
        "any(m.split('.')[0] == 'transformers' for m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=pickle.dumps(model_config), capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == [str(CONFIGS["stories260K"].hidden_size), "10000.0", "False"]
    # Without a snapshot the receiving process loads its own config from the path, as before.
    plain = pickle.loads(pickle.dumps(ModelConfig(STORIES)))
    assert type(plain.hf_config).__module__.startswith("transformers")


@pytest.mark.parametrize(
    "name,layer_type", [("llama3_rope", None), ("gemma3", "full_attention"), ("gemma3", "sliding_attention")]
)
def test_rope_from_a_snapshot_equals_rope_from_the_config(name: str, layer_type: str | None) -> None:
    """Scaled RoPE goes through transformers' functions, which the snapshot hands the config it rebuilds."""
    import torch

    from tram.model.layers.rope import _inv_freq_and_scaling

    config = CONFIGS[name]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    want = _inv_freq_and_scaling(config, head_dim, layer_type)
    got = _inv_freq_and_scaling(snapshot_hf_config(config), head_dim, layer_type)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert type(snapshot_hf_config(config).to_hf_config()) is type(config)
