"""The Ray executor, for real: a local Ray instance first (TP=2, TP=2 x PP=2 in four actors, and
`tram serve --data-parallel-size 2` with both replicas on one Ray cluster the server starts), then
two Ray nodes on one machine, each in its own network namespace joined by a veth pair, with one
rank per namespace (TP=2, then PP=2). Greedy output must equal transformers'. Skips, saying why,
where Ray, root or network namespaces are missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import STORIES, STORIES_EOS, assert_no_leak, hf_greedy, hf_logprobs
from server_utils import RemoteServer, assert_idle, pid_alive

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tram-llm[ray]')")

from tram import LLM, SamplingParams  # noqa: E402
from tram.executor import WorkerDiedError  # noqa: E402

PROMPT_IDS = [[1, 403, 407, 263, 931 % 512, 29], [1, 320, 330, 340]]
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
NS = ("tram-ray-a", "tram-ray-b")
IPS = ("10.213.0.1", "10.213.0.2")
IFACE = "tramnet"  # the same name in both namespaces, so one GLOO_SOCKET_IFNAME serves both
HEAD_PORT = 6391


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    os.environ.update(RAY_ENV)
    # Four logical CPUs on two cores: TP=2 x PP=2 needs a bundle per rank (one thread each).
    ray.init(num_cpus=4, object_store_memory=80 << 20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_tensor_parallel_on_local_ray_matches_transformers(local_ray, stories_path: str):
    llm = LLM(
        stories_path, tensor_parallel_size=2, distributed_executor_backend="ray", max_num_seqs=8, max_model_len=128
    )
    executor = llm.llm_engine.engine_core.executor
    try:
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in PROMPT_IDS], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False
        )
        for p, out in zip(PROMPT_IDS, outs):
            assert out.outputs[0].token_ids == hf_greedy(stories_path, p, 24, STORIES_EOS)
        assert_no_leak(llm.llm_engine)
        # A rank that dies fails the next step at once, and the engine stays failed.
        ray.kill(executor._actors[1])
        llm.llm_engine.add_request("after", {"prompt_token_ids": PROMPT_IDS[0]}, SamplingParams(max_tokens=4))
        with pytest.raises(WorkerDiedError):
            llm.llm_engine.step()
        with pytest.raises(WorkerDiedError):
            llm.llm_engine.step()
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_tensor_and_pipeline_parallel_on_four_ray_actors(local_ray, stories_path: str):
    llm = LLM(
        stories_path,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        distributed_executor_backend="ray",
        max_num_seqs=8,
        max_model_len=128,
        max_num_batched_tokens=16,
    )  # longer prompts are chunked
    try:
        assert len(llm.llm_engine.engine_core.executor._actors) == 4
        prompts = [p * 4 for p in PROMPT_IDS]  # 24 and 16 tokens: chunked at 16
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False
        )
        for p, out in zip(prompts, outs):
            assert out.outputs[0].token_ids == hf_greedy(stories_path, p, 24, STORIES_EOS)
        out = llm.generate(
            {"prompt_token_ids": PROMPT_IDS[0]}, SamplingParams(temperature=0, max_tokens=8, logprobs=3), use_tqdm=False
        )[0]
        ref = hf_logprobs(stories_path, PROMPT_IDS[0] + out.outputs[0].token_ids)
        for i, row in enumerate(out.outputs[0].logprobs):
            for tid, lp in row.items():
                assert lp.logprob == pytest.approx(ref[len(PROMPT_IDS[0]) - 1 + i, tid].item(), abs=1e-4)
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [d for c in map(int, out) for d in (c, *_descendants(c))]


def test_serving_two_replicas_on_one_ray_cluster(llm: LLM):
    """No RAY_ADDRESS: the API server starts one local Ray cluster and both replicas place their
    rank there (racing replicas would otherwise each start their own); SIGTERM stops all of it."""
    prompts = [[1, 403, 407, 263], [1, 320, 330, 340], [1, 263, 931 % 512, 29], [1, 407, 29, 340]]
    reference = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False
    )
    for p, out in zip(prompts, reference):
        assert out.outputs[0].token_ids == hf_greedy(STORIES, p, 16, STORIES_EOS)
    # "local": a new cluster even where an earlier `ray start` left its address behind on this machine.
    s = RemoteServer(
        str(STORIES),
        ["--data-parallel-size", "2", "--distributed-executor-backend", "ray", "--max-num-seqs", "8"],
        timeout=180,
        env={**RAY_ENV, "RAY_ADDRESS": "local"},
    )
    family = _descendants(s.proc.pid)
    assert any(b"raylet" in Path(f"/proc/{p}/cmdline").read_bytes() for p in family if pid_alive(p))
    try:
        for p, out in zip(prompts, reference):  # one at a time: each goes to the idler replica
            r = httpx.post(
                s.url + "/v1/completions", json={"prompt": p, "max_tokens": 16, "temperature": 0}, timeout=60
            )
            assert r.json()["choices"][0]["text"] == out.outputs[0].text
        log = s.log()
        assert log.count("Started 1 Ray actors") == 2, log[-3000:]  # one rank per replica, on Ray
        assert "place their ranks on the Ray cluster at" in log
        assert_idle(s)
    finally:
        code = s.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM)
    assert not any(pid_alive(p) for p in family)  # the engine cores, the Ray cluster and its actors


def test_without_ray_the_backend_fails_with_one_line(monkeypatch, stories_path: str):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match=r"needs Ray, which is not installed: pip install 'tram-llm\[ray\]'"):
        LLM(stories_path, tensor_parallel_size=2, distributed_executor_backend="ray")


# ---- two nodes, two network namespaces --------------------------------------------------------
def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _make_namespaces() -> str | None:
    """The two namespaces and their link; None, or the reason they cannot be made here."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    _delete_namespaces()
    steps = [
        ("ip", "netns", "add", NS[0]),
        ("ip", "netns", "add", NS[1]),
        ("ip", "link", "add", "tramv0", "type", "veth", "peer", "name", "tramv1"),
        ("ip", "link", "set", "tramv0", "netns", NS[0]),
        ("ip", "link", "set", "tramv1", "netns", NS[1]),
    ]
    for i, ns in enumerate(NS):
        steps += [
            ("ip", "-n", ns, "link", "set", f"tramv{i}", "name", IFACE),
            ("ip", "-n", ns, "addr", "add", f"{IPS[i]}/24", "dev", IFACE),
            ("ip", "-n", ns, "link", "set", IFACE, "up"),
            ("ip", "-n", ns, "link", "set", "lo", "up"),
        ]
    for step in steps:
        done = _run(*step)
        if done.returncode != 0:
            _delete_namespaces()
            return f"the environment refuses network namespaces: `{' '.join(step)}`: {done.stderr.strip()}"
    return None


def _delete_namespaces() -> None:
    for ns in NS:
        _run("ip", "netns", "delete", ns)


def _ray_node(ns: str, ip: str, head: bool, temp_dir: str) -> subprocess.Popen:
    role = (
        ["--head", f"--port={HEAD_PORT}", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
        if head
        else [f"--address={IPS[0]}:{HEAD_PORT}"]
    )
    env = {**os.environ, **RAY_ENV, "GLOO_SOCKET_IFNAME": IFACE}
    cmd = [
        "ip",
        "netns",
        "exec",
        ns,
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        *role,
        f"--node-ip-address={ip}",
        "--num-cpus=1",
        "--num-gpus=0",
        "--object-store-memory=80000000",
        "--disable-usage-stats",
        "--block",
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_nodes(count: int, timeout: float = 90.0) -> None:
    script = "import ray; ray.init(address='auto', log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = subprocess.run(
            ["ip", "netns", "exec", NS[0], sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **RAY_ENV, "RAY_ADDRESS": f"{IPS[0]}:{HEAD_PORT}"},
        )
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(0.5)
    raise AssertionError(f"the Ray cluster did not reach {count} nodes in {timeout:.0f} s")


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    reason = _make_namespaces()
    if reason is not None:
        pytest.skip(reason)
    temp_dir = str(tmp_path_factory.mktemp("ray"))
    nodes: list[subprocess.Popen] = []
    try:
        nodes.append(_ray_node(NS[0], IPS[0], True, temp_dir))
        _wait_for_nodes(1)
        nodes.append(_ray_node(NS[1], IPS[1], False, temp_dir))  # the driver waits for it to join
        yield
    finally:
        for node in nodes:
            node.terminate()  # --block: the node stops its Ray processes when told to (all at once)
        for node in nodes:
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
        _delete_namespaces()


SPLITS = [(2, 1), (1, 2)]


@pytest.fixture(scope="module")
def two_node_results(two_node_cluster, stories_path: str) -> dict:
    """Each split's result from one driver run inside the first namespace (ray_driver.py)."""
    driver = Path(__file__).with_name("ray_driver.py")
    env = {**os.environ, **RAY_ENV, "RAY_ADDRESS": f"{IPS[0]}:{HEAD_PORT}", "GLOO_SOCKET_IFNAME": IFACE}
    done = subprocess.run(
        ["ip", "netns", "exec", NS[0], sys.executable, str(driver), stories_path, json.dumps(SPLITS)]
        + [json.dumps(PROMPT_IDS), str(len(NS))],
        capture_output=True,
        text=True,
        timeout=360,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tp,pp", SPLITS)
def test_one_rank_per_node_matches_transformers(two_node_results: dict, stories_path: str, tp: int, pp: int):
    result = two_node_results[f"{tp}x{pp}"]
    assert "error" not in result, result.get("error")
    assert sorted(result["nodes"]) == sorted(IPS)  # one rank in each namespace
    assert result["kv"]["in_use"] == 0
    for p, tokens in zip(PROMPT_IDS, result["tokens"]):
        assert tokens == hf_greedy(stories_path, p, 24, STORIES_EOS)
