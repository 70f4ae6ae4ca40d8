"""Configuration is a leaf: `import tram.config` loads nothing else of Tram's, and the values a layer
owns (attention backends, executor backends, quantization methods, grammar engines, tool call
parsers) are registered by that layer, validated by configuration against the registry, and listed
by `tram serve --help` from it, without torch in the API process."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import STORIES
from server_utils import REPO

from tram.config import EngineArgs, ModelConfig, ServerArgs
from tram.config.cli_args import field_default
from tram.config.registry import ChoiceKind
from tram.engine.engine_config import create_engine_config
from tram.entrypoints.cli import build_parser
from tram.model.choices import GGUF_WITHOUT_TP


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_tram_config_pulls_in_no_other_tram_package() -> None:
    loaded = _run(
        "import sys, tram; before = set(sys.modules); import tram.config; "
        "print(' '.join(sorted(m for m in set(sys.modules) - before if m.startswith('tram'))))"
    )
    others = [m for m in loaded.split() if not m.startswith("tram.config")]
    assert loaded and not others, others


def test_the_command_line_registers_every_choice_without_torch() -> None:
    out = _run(
        "import sys, tram.entrypoints.cli as cli, tram.config.registry as r; "
        "kinds = [v for v in vars(r).values() if isinstance(v, r.ChoiceKind)]; "
        "print(all(k.names() for k in kinds), 'torch' in sys.modules)"
    )
    assert out == "True False"


def test_help_lists_the_registered_names(capsys: pytest.CaptureFixture[str]) -> None:
    from tram.config import registry

    serve = build_parser(["serve"])._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = " ".join(serve.format_help().split())
    kinds = [v for v in vars(registry).values() if isinstance(v, ChoiceKind)]
    assert len(kinds) >= 6
    for kind in kinds:
        assert kind.names() and all(f" {name}" in text for name in kind), kind.setting
    assert "hermes (Qwen, Hermes)" in text and "llguidance (= guidance)" in text


def test_every_registry_default_is_registered() -> None:
    for cls in (EngineArgs, ServerArgs):
        for f in dataclasses.fields(cls):
            kind, default = f.metadata.get("choices"), field_default(f)
            if isinstance(kind, ChoiceKind) and default is not None:
                assert default in kind, (f.name, default)


def test_a_kind_validates_against_what_was_registered() -> None:
    kind = ChoiceKind("widget", "widget")
    settings = SimpleNamespace()
    kind.validate("plain", settings, "widget 'plain'", default="plain")  # the declared default needs no lookup
    with pytest.raises(ValueError, match="no widget is registered"):
        kind.validate("fancy", settings, "widget 'fancy'")
    kind.add("fancy", "with a help line", target=f"{__name__}:_reader", aliases=("posh",))

    @kind.register("built")
    class Built:
        pass

    assert kind.names() == ("fancy", "posh", "built") and kind.load("built") is Built
    assert kind.load("posh") is _reader and kind.canonical("posh") == "fancy"
    assert kind.help_text() == "fancy (with a help line), posh (= fancy), built"
    with pytest.raises(ValueError, match="widget 'odd' is not supported: choose one of fancy, posh, built"):
        kind.validate("odd", settings, "widget 'odd'")
    refused: list[str] = []
    kind.add_check(lambda name, _: refused.append(name))
    kind.validate("fancy", settings, "widget 'fancy'")
    assert refused == ["fancy"]
    with pytest.raises(LookupError):
        kind.default("cpu")
    kind.set_default(lambda device_type: "built" if device_type == "cpu" else "fancy")
    assert (kind.default("cpu"), kind.default("cuda")) == ("built", "fancy")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(attention_backend="flash"), "Unknown attention backend 'flash'. Supported backends: torch, triton"),
        (
            dict(structured_outputs_backend="outlines"),
            "structured_outputs_backend 'outlines' is not supported: choose one of xgrammar, auto",
        ),
        (dict(quantization="fp6"), "quantization 'fp6' is not supported: choose int8 or int4"),
        (dict(distributed_executor_backend="threads"), "not supported: choose uni or mp or ray"),
        (dict(gguf_activations="int8"), "gguf_activations 'int8' applies to GGUF files"),
        (dict(kv_cache_dtype="fp16"), "kv_cache_dtype 'fp16' is not supported: choose one of auto, fp8"),
    ],
)
def test_engine_args_refuse_unregistered_names(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineArgs(STORIES, **kwargs).validate()


def test_aliases_resolve_to_the_registered_name() -> None:
    for given, resolved in (("auto", "xgrammar"), ("llguidance", "guidance"), ("xgrammar", "xgrammar")):
        config = create_engine_config(EngineArgs(STORIES, structured_outputs_backend=given))
        assert config.structured_outputs_backend == resolved
    assert config.parallel_config.distributed_executor_backend == "uni"


def test_a_gguf_file_with_tensor_parallelism_is_refused_before_it_is_read(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not read")
    with pytest.raises(ValueError, match=GGUF_WITHOUT_TP.replace("(", r"\(").replace(")", r"\)")):
        create_engine_config(EngineArgs(str(fake), tensor_parallel_size=2))


def _reader(path: str) -> SimpleNamespace:
    return SimpleNamespace(read_from=path, architectures=["LlamaForCausalLM"])


def test_model_config_resolves_the_attention_backend_the_model_layer_registered() -> None:
    config = ModelConfig(STORIES, device="cpu")
    config.resolve()
    assert config.attention_backend == "torch"


def test_model_config_pickles_without_its_hf_config_and_reads_it_again() -> None:
    config = ModelConfig(STORIES)
    state = config.__getstate__()
    assert state["hf_config"] is None and state["config_reader"] is None
    assert pickle.loads(pickle.dumps(config)).hf_config.vocab_size == config.hf_config.vocab_size
    other = ModelConfig("some/file.bin", config_reader=f"{__name__}:_reader")
    assert pickle.loads(pickle.dumps(other)).hf_config.read_from == "some/file.bin"
