"""Large request bodies are parsed, and their parameters built, off the event loop; small ones on it
(a thread hop costs more than they do)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from tram.server.http import large_json
from tram.server.http.large_json import LARGE_BODY_BYTES, LargeJSONRoute, off_loop_if_large


@pytest.fixture
def app_and_threads(monkeypatch: pytest.MonkeyPatch) -> tuple[TestClient, dict[str, int]]:
    threads: dict[str, int] = {}
    real_loads = json.loads

    def loads(text: Any) -> Any:
        threads.setdefault("parse", threading.get_ident())  # the body: the first parse
        return real_loads(text)

    monkeypatch.setattr(large_json.json, "loads", loads)
    app = FastAPI()
    app.router.route_class = LargeJSONRoute

    @app.post("/echo")
    async def echo(body: dict[str, Any], request: Request) -> dict[str, Any]:
        threads["loop"] = threading.get_ident()
        threads["params"] = await off_loop_if_large(request, threading.get_ident)
        return {"keys": len(body["items"])}

    return TestClient(app), threads


@pytest.mark.parametrize("items,off_loop", [(10, False), (LARGE_BODY_BYTES // 8, True)])
def test_only_a_large_body_leaves_the_loop(app_and_threads, items: int, off_loop: bool) -> None:
    client, threads = app_and_threads
    body = {"items": {f"k{i}": i for i in range(items)}}
    assert (len(json.dumps(body)) > LARGE_BODY_BYTES) == off_loop
    resp = client.post("/echo", json=body)
    assert resp.status_code == 200 and resp.json() == {"keys": items}
    assert (threads["parse"] != threads["loop"]) == off_loop
    assert (threads["params"] != threads["loop"]) == off_loop


def test_a_large_malformed_body_is_still_a_422(app_and_threads) -> None:
    client, _ = app_and_threads
    text = '{"items": {' + ",".join(f'"k{i}": {i}' for i in range(LARGE_BODY_BYTES // 8)) + ",}}"
    resp = client.post("/echo", content=text, headers={"content-type": "application/json"})
    assert resp.status_code == 422, resp.text
