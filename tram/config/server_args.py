"""Settings of the OpenAI-compatible server itself (the engine's are `EngineArgs`), declared once."""
from __future__ import annotations

from dataclasses import dataclass

from tram.config.cli_args import CliSettings, setting

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
DEFAULT_LOG_INTERVAL = 5.0  # seconds between two throughput log lines


@dataclass
class ServerArgs(CliSettings):
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on")
    served_model_name: list[str] | None = setting(None, "name(s) clients use in 'model' (default: the model path)")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on /v1 routes", env="TRAM_API_KEY")
    chat_template: str | None = setting(None, "a Jinja chat template, or a file holding one")
    max_queued_requests: int | None = setting(None, "answer 429 while this many requests are already waiting")
    uvicorn_log_level: str = setting("warning", "uvicorn's log level", choices=UVICORN_LOG_LEVELS)
    log_stats_interval: float = setting(DEFAULT_LOG_INTERVAL, "seconds between throughput log lines")
    max_request_body_bytes: int = setting(16 * 1024 * 1024, "answer 413 to a request body larger than this")
