"""The access log middleware in-process: a stream is logged when it ends (its latency is the whole
stream's), tokens the engine counted for the request appear, and --disable-uvicorn-access-log
turns the line off."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from tram.config import ServerArgs
from tram.engine.usage import current_usage
from tram.server.api_server import _install_middleware


@pytest.fixture
def access_log() -> list[str]:
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("tram.server.access")
    log.addHandler(handler)
    yield lines
    log.removeHandler(handler)


def _app(server_args: ServerArgs) -> FastAPI:
    app = FastAPI()

    @app.get("/slow-stream")
    async def slow_stream() -> StreamingResponse:
        usage = current_usage()  # what AsyncLLM.add_request does for each engine request
        usage.requests, usage.prompt_tokens = 1, 4

        async def chunks():
            for _ in range(3):
                await asyncio.sleep(0.1)
                usage.output_tokens += 2
                yield "data: x\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/plain")
    async def plain() -> dict:
        return {}

    @app.get("/health")
    async def health() -> dict:
        return {}

    _install_middleware(app, server_args)
    return app


async def _get(app: FastAPI, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4321))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get(path)


def test_a_stream_is_logged_when_it_ends_with_its_tokens(access_log: list[str]) -> None:
    app = _app(ServerArgs())
    assert asyncio.run(_get(app, "/slow-stream")).status_code == 200
    assert asyncio.run(_get(app, "/plain")).status_code == 200
    assert asyncio.run(_get(app, "/missing")).status_code == 404
    assert asyncio.run(_get(app, "/health")).status_code == 200  # a probe: not logged while it succeeds
    stream = re.fullmatch(
        r'10\.0\.0\.1:4321 "GET /slow-stream" 200 (\d+\.\d) ms prompt_tokens=4 output_tokens=6', access_log[0]
    )
    assert stream and float(stream.group(1)) >= 300, access_log
    assert re.fullmatch(r'10\.0\.0\.1:4321 "GET /plain" 200 \d+\.\d ms', access_log[1])
    assert re.fullmatch(r'10\.0\.0\.1:4321 "GET /missing" 404 \d+\.\d ms', access_log[2])
    assert len(access_log) == 3


def test_disable_uvicorn_access_log_turns_it_off(access_log: list[str]) -> None:
    app = _app(ServerArgs(disable_uvicorn_access_log=True))
    assert asyncio.run(_get(app, "/plain")).status_code == 200
    assert access_log == []
