"""vLLM's serve flags against one real `tram serve`, over https: /ping, /v1/models/{id}, CORS from
--allowed-origins, --response-role, --root-path, --max-log-len, and the log it writes: starting
before the engine, Ready once listening, the engine core's lines, and one access line per request."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import STORIES
from server_utils import free_port

from tram.bench.server_process import ServerProcess

ORIGIN = "https://app.example"
FLAGS = [
    "--served-model-name",
    "org/stories",
    "alias",
    "--response-role",
    "narrator",
    "--allowed-origins",
    f'["{ORIGIN}"]',
    "--root-path",
    "/proxy",
    "--max-log-len",
    "8",
    "--generation-config",
    "vllm",
]


class TLSServer(ServerProcess):
    """`tram serve` with --ssl-keyfile/--ssl-certfile, awaited on https."""

    def __init__(self, cert: Path, key: Path, args: list[str]) -> None:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "tram",
            "serve",
            STORIES,
            "--port",
            str(port),
            "--ssl-keyfile",
            str(key),
            "--ssl-certfile",
            str(cert),
            *args,
        ]
        super().__init__(
            "tram-serve-tls", argv, port, env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, timeout=120
        )

    def _wait_healthy(self, timeout: float) -> None:
        self.url = f"https://127.0.0.1:{self.port}"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tram serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", verify=False, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tram serve did not come up:\n{self.log()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    srv = TLSServer(cert, key, FLAGS)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server: TLSServer):
    with httpx.Client(base_url=server.url, verify=False, timeout=30) as c:
        yield c


def _log_lines(server: TLSServer, pattern: str, timeout: float = 5.0) -> list[str]:
    """Log lines matching `pattern` (the access line is written just after the response ends)."""
    deadline = time.time() + timeout
    while True:
        found = [line for line in server.log().splitlines() if re.search(pattern, line)]
        if found or time.time() > deadline:
            return found
        time.sleep(0.05)


def test_tls_only(server: TLSServer) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)


def test_ping_is_health(client: httpx.Client) -> None:
    assert client.get("/ping").status_code == 200
    assert client.post("/ping").status_code == 200


def test_model_by_id_including_slashes(client: httpx.Client) -> None:
    listed = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == ["org/stories", "alias"]
    for card in listed:
        one = client.get(f"/v1/models/{card['id']}")
        assert one.status_code == 200
        assert {**one.json(), "created": 0} == {**card, "created": 0}
    missing = client.get("/v1/models/org/other")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found" and "org/other" in missing.json()["error"]["message"]


def test_cors_preflight_allows_only_the_given_origins(client: httpx.Client) -> None:
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    ok = client.options("/v1/chat/completions", headers={"Origin": ORIGIN, **ask})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in ok.headers["access-control-allow-methods"]
    refused = client.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **ask})
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    simple = client.get("/v1/models", headers={"Origin": ORIGIN})
    assert simple.headers["access-control-allow-origin"] == ORIGIN


def test_response_role(client: httpx.Client) -> None:
    body = {"model": "alias", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    reply = client.post("/v1/chat/completions", json=body).json()
    assert reply["choices"][0]["message"]["role"] == "narrator"
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
    assert '"role": "narrator"' in first or '"role":"narrator"' in first


def test_root_path(client: httpx.Client) -> None:
    assert client.get("/openapi.json").json()["servers"] == [{"url": "/proxy"}]
    assert client.get("/proxy/ping").status_code == 200  # a proxy that keeps the prefix works too


def test_log_says_starting_then_ready_once_listening(server: TLSServer) -> None:
    log = server.log()
    starting = log.index("Tram ")
    assert "starting: loading" in log[starting:].splitlines()[0]
    engine = log.index("engine core: ")  # a line from the engine core process reaches the server's log
    ready = log.index(f"Ready: {server.url} ")
    assert starting < engine < ready and log.count("Ready: ") == 1
    assert "serving" not in log[:ready]


def test_access_log_line_per_request(client: httpx.Client, server: TLSServer) -> None:
    body = {"model": "alias", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
    assert client.post("/v1/completions", json=body).status_code == 200
    with client.stream("POST", "/v1/completions", json={**body, "max_tokens": 7, "stream": True}) as r:
        assert "[DONE]" in r.read().decode()
    assert client.get("/v1/models/nope").status_code == 404
    line = r'127\.0\.0\.1:\d+ "POST /v1/completions" 200 \d+\.\d ms prompt_tokens=(\d+) output_tokens={}$'
    plain = _log_lines(server, line.format(5))
    streamed = _log_lines(server, line.format(7))
    assert len(plain) == 1 and len(streamed) == 1, server.log()[-3000:]
    assert int(re.search(line.format(5), plain[0]).group(1)) > 3
    assert _log_lines(server, r'"GET /v1/models/nope" 404 \d+\.\d ms$')


def test_request_log_is_cut_to_max_log_len(client: httpx.Client, server: TLSServer) -> None:
    body = {"model": "alias", "prompt": "Tom and his dog went out", "max_tokens": 2}
    assert client.post("/v1/completions", json=body).status_code == 200
    lines = _log_lines(server, r"Received request cmpl-\S+: prompt: 'Tom and ',")
    assert len(lines) == 1, server.log()[-3000:]
    ids = re.search(r"prompt_token_ids: \[([\d, ]*)\]", lines[0]).group(1)
    assert len(ids.split(", ")) == 8
