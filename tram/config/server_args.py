"""Settings of the OpenAI-compatible server itself (the engine's are `EngineArgs`), declared once.

Names and defaults follow vLLM's `vllm serve`, so that its command lines work here; a vLLM setting
Tram does not implement yet is accepted only at its default (`validate` says so otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from tram.config.cli_args import CliSettings, check_choices, setting
from tram.config.registry import REASONING_PARSERS, TOOL_CALL_PARSERS

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
DEFAULT_LOG_INTERVAL = 5.0  # seconds between two throughput log lines


@dataclass
class ServerArgs(CliSettings):
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on")
    served_model_name: list[str] | None = setting(None, "name(s) clients use in 'model' (default: the model path)")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on /v1 routes", env="TRAM_API_KEY")
    chat_template: str | None = setting(None, "a Jinja chat template, or a file holding one")
    response_role: str = setting("assistant", "the role of the generated message in chat completions")
    max_queued_requests: int | None = setting(None, "answer 429 while this many requests are already waiting")
    root_path: str | None = setting(None, "path prefix under which a proxy serves the app (FastAPI's root_path)")
    ssl_keyfile: str | None = setting(None, "TLS private key file: serve https (with --ssl-certfile)")
    ssl_certfile: str | None = setting(None, "TLS certificate file: serve https (with --ssl-keyfile)")
    # CORS, as vLLM: every origin, method and header by default, no credentials.
    allowed_origins: list[str] = setting(["*"], "origins browsers may call from (CORS); items or a JSON list")
    allowed_methods: list[str] = setting(["*"], "HTTP methods allowed cross-origin (CORS)")
    allowed_headers: list[str] = setting(["*"], "request headers allowed cross-origin (CORS)")
    allow_credentials: bool = setting(False, "allow cookies and auth headers cross-origin (CORS)")
    # Logging: which line each switch controls is in README.md ("Logs").
    uvicorn_log_level: str = setting("warning", "uvicorn's log level", choices=UVICORN_LOG_LEVELS)
    disable_uvicorn_access_log: bool = setting(
        False, "no access log line per HTTP request (method, path, status, latency, tokens)"
    )
    enable_log_requests: bool = setting(
        True,
        "log each generation request as the engine receives it (id, prompt, sampling params)",
        off_flag="disable-log-requests",
    )
    max_log_len: int | None = setting(
        None, "characters of prompt (and prompt token ids) a request log line shows (default: all)"
    )
    log_stats_interval: float = setting(DEFAULT_LOG_INTERVAL, "seconds between throughput log lines")
    max_request_body_bytes: int = setting(16 * 1024 * 1024, "answer 413 to a request body larger than this")
    # Slow or stalled clients cannot hold connections (tram/server/http/connections.py).
    timeout_keep_alive: float = setting(5.0, "seconds an idle keep-alive connection stays open (uvicorn's setting)")
    timeout_read_headers: float = setting(
        20.0, "seconds a request's headers may take, from the connection opening or the last response (then 408)"
    )
    timeout_read_body: float = setting(20.0, "seconds a request body may pause between two pieces (then 408)")
    limit_concurrency: int | None = setting(
        None, "answer 503 beyond this many open connections or requests in flight (uvicorn's setting)"
    )
    enable_auto_tool_choice: bool = setting(
        False, 'let the model decide when to call tools (tool_choice "auto"); needs --tool-call-parser'
    )
    tool_call_parser: str | None = setting(
        None, 'how to find tool calls in the model\'s text for tool_choice "auto"', choices=TOOL_CALL_PARSERS
    )
    reasoning_parser: str | None = setting(
        None,
        "how to tell the model's thinking from its answer: the thinking goes to reasoning_content, and "
        "structured outputs and forced tool calls apply only after it ends",
        choices=REASONING_PARSERS,
    )

    def label(self, name: str, value: object) -> str:
        return f"--{name.replace('_', '-')} {value}"  # the server's messages name its flags

    def validate(self) -> None:
        """Reject bad values and what Tram does not support yet (ValueError), before anything loads."""
        check_choices(self)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("https needs both --ssl-keyfile and --ssl-certfile")
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValueError(f"max_log_len must be >= 0, got {self.max_log_len}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        for name in ("timeout_keep_alive", "timeout_read_headers", "timeout_read_body"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError(f"limit_concurrency must be >= 1, got {self.limit_concurrency}")
