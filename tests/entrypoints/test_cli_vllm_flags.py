"""`tram serve` takes a pasted `vllm serve` command line: the flags Tram implements are honoured, the
ones it does not are refused with a message naming them, before any model loads. `--help` shows
every flag's default; `tram --version` answers; a taken port fails at once with one clear line."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import STORIES
from server_utils import REPO

import tram
from tram.config import EngineArgs, ServerArgs
from tram.engine.engine_config import create_engine_config
from tram.entrypoints.cli import build_parser, main

PASTED = (
    f"serve --model {STORIES} --trust-remote-code --max-num-batched-tokens 2048 --enable-chunked-prefill "
    "--disable-log-requests --uvicorn-log-level info --host 0.0.0.0 --port 8001 --served-model-name stories "
    "--max-model-len 256 --max-num-seqs 32 --dtype float32 --seed 7 --tokenizer-mode auto --revision main "
    "--download-dir /tmp/hf --generation-config vllm --response-role bot --tensor-parallel-size 1 "
    '--allowed-origins \'["https://a.example", "https://b.example"]\' --allowed-methods GET POST '
    "--allow-credentials --root-path /api --max-log-len 100 --disable-uvicorn-access-log "
    "--gpu-memory-utilization 0.85 --enable-prefix-caching --block-size 32"
)


def _parse(command: str) -> tuple[EngineArgs, ServerArgs]:
    argv = shlex.split(command)
    ns = build_parser(argv).parse_args(argv)
    return EngineArgs.from_cli_args(ns), ServerArgs.from_cli_args(ns)


def _serve_error(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """The error `tram serve` prints for these flags (it must exit non-zero before loading anything)."""
    assert main(["serve", STORIES, "--port", "0", *flags]) == 2  # port 0 is refused after the flags
    return capsys.readouterr().err


def test_a_pasted_vllm_command_line_parses_to_its_settings() -> None:
    engine, server = _parse(PASTED)
    assert engine.model == STORIES and engine.trust_remote_code is True
    assert (engine.max_num_batched_tokens, engine.enable_chunked_prefill) == (2048, True)
    assert (engine.max_model_len, engine.max_num_seqs, engine.dtype, engine.seed) == (256, 32, "float32", 7)
    assert (engine.tokenizer_mode, engine.revision, engine.download_dir) == ("auto", "main", "/tmp/hf")
    assert (engine.generation_config, engine.tensor_parallel_size, engine.block_size) == ("vllm", 1, 32)
    assert engine.gpu_memory_utilization == 0.85 and engine.enable_prefix_caching is True
    assert server.enable_log_requests is False and server.disable_uvicorn_access_log is True
    assert (server.uvicorn_log_level, server.host, server.port) == ("info", "0.0.0.0", 8001)
    assert server.served_model_name == ["stories"] and server.response_role == "bot"
    assert server.allowed_origins == ["https://a.example", "https://b.example"]
    assert server.allowed_methods == ["GET", "POST"] and server.allowed_headers == ["*"]
    assert server.allow_credentials is True and server.root_path == "/api" and server.max_log_len == 100
    engine.validate()
    server.validate()


def test_defaults_follow_vllm() -> None:
    engine, server = _parse(f"serve {STORIES}")
    assert engine.model == STORIES and engine.generation_config == "auto" and engine.tensor_parallel_size == 1
    assert server.enable_log_requests is True and server.disable_uvicorn_access_log is False
    assert server.allowed_origins == server.allowed_methods == server.allowed_headers == ["*"]
    assert server.response_role == "assistant" and server.allow_credentials is False


def test_spellings_positional_or_flag_and_aliases() -> None:
    assert _parse(f"serve --port 9 --model {STORIES}")[0].model == STORIES
    assert _parse(f"serve {STORIES} --model {STORIES}")[0].model == STORIES  # the same twice is fine
    assert _parse(f"serve {STORIES} -tp 1")[0].tensor_parallel_size == 1
    assert _parse(f"serve {STORIES} --no-enable-log-requests")[1].enable_log_requests is False
    assert _parse(f"serve {STORIES} --enable-log-requests")[1].enable_log_requests is True
    assert _parse(f"serve {STORIES} --allowed-origins https://a.example https://b.example")[1].allowed_origins == [
        "https://a.example",
        "https://b.example",
    ]


def test_model_missing_or_given_twice_differently(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "0"]) == 2
    assert "a model is required: give it as the first argument or as --model" in capsys.readouterr().err
    assert main(["serve", STORIES, "--model", "other/model"]) == 2
    assert "two different values for model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tokenizer-mode", "slow"],
            "tokenizer_mode 'slow' is not supported: Tram's incremental detokenizer needs a fast tokenizer",
        ),
        (["--tokenizer-mode", "mistral"], "tokenizer_mode 'mistral' is not supported"),
        (["--no-enable-chunked-prefill"], "--no-enable-chunked-prefill is not supported"),
        (["-tp", "2", "--distributed-executor-backend", "uni"], "distributed_executor_backend 'uni' runs one rank"),
        (
            ["--tool-call-parser", "phi4_mini_json"],
            "--tool-call-parser phi4_mini_json is not supported: choose one of granite, hermes, llama3_json, mistral,",
        ),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
        (
            ["--generation-config", "/no/such/folder"],
            "generation_config '/no/such/folder' must be auto, vllm, or a folder holding a generation_config.json",
        ),
        (["--ssl-keyfile", "key.pem"], "https needs both --ssl-keyfile and --ssl-certfile"),
    ],
)
def test_unsupported_values_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    err = _serve_error(capsys, *flags)
    assert err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_flag_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", STORIES, "--enable-lora"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --enable-lora" in capsys.readouterr().err


def _option_blocks(help_text: str) -> dict[str, str]:
    """Each option's block of `--help` (its flag line and wrapped description), by first flag."""
    blocks: dict[str, str] = {}
    current = None
    for line in help_text.split("options:", 1)[1].splitlines():
        match = re.match(r"  (-{1,2}[\w-]+)", line)
        if match:
            current = match.group(1)
            blocks[current] = line
        elif current is not None:
            blocks[current] += " " + line.strip()
    return blocks


def test_help_shows_every_flags_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    blocks = _option_blocks(capsys.readouterr().out)
    serve = build_parser(["serve"])._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {a.option_strings[0] for a in serve._actions if a.option_strings and a.dest != "help"}
    assert flags <= set(blocks) and len(flags) > 40
    missing = sorted(f for f in flags if "(default" not in re.sub(r"\s+", " ", blocks[f]))
    assert not missing, f"flags whose help shows no default: {missing}"
    assert "(default: false)" in blocks["--trust-remote-code"] and "(default: 0)" in blocks["--seed"]
    assert "(default: none)" in blocks["--revision"] and "(default: true)" in blocks["--enable-log-requests"]


def test_help_never_shows_the_api_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRAM_API_KEY", "sekrit-key")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "sekrit-key" not in out and "$TRAM_API_KEY if set" in out


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tram", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == f"tram {tram.__version__}"


def test_a_taken_port_fails_at_once_without_loading_the_model() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "tram", "serve", STORIES, "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: the port is already in use "
        "(another server?); stop it or choose another --port"
    )
    assert elapsed < 15, f"took {elapsed:.1f} s: it should fail before loading anything"


def test_generation_config_chooses_the_servers_sampling_defaults(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tram.server.handlers.base import OpenAIServing

    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_k": 7}))

    def defaults(value: str) -> dict:
        config = create_engine_config(EngineArgs(STORIES, generation_config=value))
        engine = SimpleNamespace(config=config, tokenizer=None)
        return OpenAIServing(engine, ["m"]).defaults  # type: ignore[arg-type]

    assert create_engine_config(EngineArgs(STORIES)).generation_config == STORIES  # auto: the model's
    assert (
        defaults("vllm") == {}
        and create_engine_config(EngineArgs(STORIES, generation_config="vllm")).generation_config is None
    )
    assert defaults(str(folder)) == {"temperature": 0.3, "top_k": 7}


def test_download_dir_is_where_hub_models_go(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from tram.model.hub import resolve_model_path

    seen: list[str | None] = []

    def fake_snapshot_download(
        repo_id: str, revision: str | None = None, allow_patterns=None, cache_dir: str | None = None
    ) -> str:
        seen.append(cache_dir)
        return STORIES

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve_model_path("org/tiny", None, "/data/models") == STORIES
    assert seen == ["/data/models", "/data/models"]
