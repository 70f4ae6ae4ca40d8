"""Data parallelism: the router's choices, and `tram serve --data-parallel-size 2` end to end (two
engine cores behind one API server: the same greedy outputs as one engine, both replicas used,
per-replica metrics, clean KV accounting, a clean exit)."""

from __future__ import annotations

import asyncio
import re
import signal

import httpx
import pytest
from conftest import STORIES
from server_pool import POOL, ServerSpec
from server_utils import assert_idle, child_pids, openai_client, pid_alive

from tram import LLM, SamplingParams
from tram.engine.dp_client import PrefixRouter, combine_results, prefix_block_hashes
from tram.engine.messages import EngineCoreRequest
from tram.executor.cpu_threads import ray_rank_threads, replica_threads

SERVER = ServerSpec(STORIES, ("--data-parallel-size", "2", "--max-num-seqs", "16"))
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)


def _req(rid: str, prompt: list[int], source: str | None = None) -> EngineCoreRequest:
    return EngineCoreRequest(rid, prompt, SamplingParams(), [2], 0.0, source)


def test_router_balances_load_and_follows_prefixes():
    router = PrefixRouter(2, block_size=4, slack=1)
    shared = list(range(10, 30))  # five full blocks
    assert router.route(_req("a", shared + [1])) == 0  # a tie goes to the lower index
    assert router.route(_req("b", [7] * 9)) == 1  # least loaded
    assert router.route(_req("c", shared + [2])) == 0  # loads tie: the replica holding the prefix
    assert router.route(_req("d", [8] * 9)) == 1
    assert router.route(_req("e", shared + [3])) == 0  # loads tie again
    assert router.route(_req("f", shared + [4])) == 0  # one ahead: within the slack, the prefix wins
    assert router.route(_req("g", shared + [5])) == 1  # two ahead: load wins over the prefix
    assert router.route(_req("a-1", shared + [1], source="a")) == 0  # an n > 1 sibling joins its source
    assert router.loads == [5, 3]
    for rid in ("a", "c", "e", "f", "a-1", "nope"):
        router.finish(rid)
    assert router.loads == [0, 3] and "a" not in router.owner


def test_prefix_hashes_are_chained_over_full_blocks():
    a = prefix_block_hashes(list(range(10)), 4)
    assert len(a) == 2  # the partial third block is not hashed
    assert prefix_block_hashes([9] + list(range(1, 10)), 4)[1] != a[1]  # block 1's hash covers block 0


def test_results_and_threads_combine():
    assert combine_results([{"free": 3, "in_use": 1}, {"free": 5, "in_use": 0}]) == {"free": 8, "in_use": 1}
    assert combine_results([{"kv_cache_usage": 0.2}, {"kv_cache_usage": 0.4}])["kv_cache_usage"] == pytest.approx(0.3)
    assert combine_results([True, False]) is False
    assert replica_threads({}, 2, 2) == 1  # 2 cores: one for the API server, at least one per replica
    assert replica_threads({}, 17, 4) == 4
    assert replica_threads({"TRAM_CPU_THREADS": "2"}, 16, 2) is None  # the user's, per replica
    # Ray ranks: the replica's share split over its ranks, the user's per rank, else one.
    assert ray_rank_threads({}, 8, 2) == 4 and ray_rank_threads({}, 1, 2) == 1 and ray_rank_threads({}, None, 4) == 1
    assert ray_rank_threads({"TRAM_CPU_THREADS": "3"}, 8, 2) == 3


def test_offline_data_parallel_is_refused(stories_path: str):
    with pytest.raises(ValueError, match="tram serve"):
        LLM(stories_path, data_parallel_size=2)


def test_serving_with_two_replicas() -> None:
    prompts = ["Once upon a time", "Tom and his dog", "The little bird", "Lily wanted to"] * 4
    reference = LLM(str(STORIES), max_num_seqs=16)
    expected = [
        o.outputs[0].text
        for o in reference.generate(prompts, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    ]
    s = POOL.take(SERVER)
    engines = [p for p in s.engine_pids if b"resource_tracker" not in open(f"/proc/{p}/cmdline", "rb").read()]
    family = [*s.engine_pids, *(c for p in s.engine_pids for c in child_pids(p))]
    try:
        assert len(engines) == 2

        async def run() -> list[str]:
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:

                async def one(prompt: str) -> str:
                    r = await client.post(
                        "/v1/completions", json={"prompt": prompt, "max_tokens": 20, "temperature": 0}
                    )
                    return r.json()["choices"][0]["text"]

                return await asyncio.gather(*(one(p) for p in prompts))

        assert asyncio.run(run()) == expected
        chat = openai_client(s).chat.completions.create(
            model=str(STORIES), max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
        assert chat.choices[0].finish_reason in ("length", "stop")
        metrics = httpx.get(s.url + "/metrics").text
        done = {
            e: float(v)
            for e, v in re.findall(
                r'^tram:request_success_total\{engine="(\d)",finished_reason="length",[^}]*\} (\S+)$', metrics, re.M
            )
        }
        assert set(done) == {"0", "1"} and all(v > 0 for v in done.values()), done  # both replicas served
        assert sum(done.values()) >= len(prompts)
        assert_idle(s)
    finally:
        code = s.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM)
    assert not any(pid_alive(p) for p in family)
