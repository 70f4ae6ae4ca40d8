"""Tram's loggers print INFO to stderr by default, as vLLM's do; TRAM_CONFIGURE_LOGGING=0 leaves
logging entirely to the application."""

from __future__ import annotations

import logging

import tram.envs as envs


def configure_logging() -> None:
    root = logging.getLogger("tram")
    if not envs.TRAM_CONFIGURE_LOGGING or root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(envs.TRAM_LOGGING_LEVEL)
    root.propagate = False
