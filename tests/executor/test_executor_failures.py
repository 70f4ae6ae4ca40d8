"""The executor's edges: a dead rank fails the step at once and stops every other rank; splits that
do not divide the model, or executors that cannot run them, are refused before anything loads; each
rank gets its share of the cores."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tram import LLM, SamplingParams
from tram.executor import WorkerDiedError
from tram.executor.cpu_threads import rank_threads


def test_a_killed_rank_fails_the_step_and_stops_the_others(stories_path: str):
    llm = LLM(stories_path, tensor_parallel_size=2, max_num_seqs=4, max_model_len=128)
    engine = llm.llm_engine
    executor = engine.engine_core.executor
    procs = list(executor._procs)
    try:
        engine.add_request(
            "r0",
            {"prompt_token_ids": [1, 300, 301, 302]},
            SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
        )
        engine.step()
        os.kill(procs[1].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="rank 1"):
            for _ in range(50):
                engine.step()
        assert time.monotonic() - start < 15
        for proc in procs:  # rank 0 too: it may have been waiting for rank 1 in a collective
            proc.wait(10)
        with pytest.raises(WorkerDiedError):  # and the engine stays failed
            engine.step()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(tensor_parallel_size=3), "does not divide the model's 8 attention heads"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be positive"),
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "needs mp"),
        (dict(distributed_executor_backend="threads"), "not supported: choose uni or mp or ray"),
    ],
)
def test_bad_parallel_settings_are_refused(stories_path: str, kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        LLM(stories_path, **kwargs)


def test_each_rank_gets_its_share_of_the_cores():
    assert rank_threads({}, 2, 2)[0] == 1  # two ranks on two cores: one thread each
    assert rank_threads({}, 16, 4)[0] == 4
    assert rank_threads({}, 2, 4)[0] == 1  # never fewer than one
    threads, env = rank_threads({"TRAM_CPU_THREADS": "3"}, 16, 2)
    assert threads == 3 and env["OMP_NUM_THREADS"] == "3"  # the user's count is per rank
    assert "GOMP_SPINCOUNT" in rank_threads({}, 2, 2)[1]
    assert "GOMP_SPINCOUNT" not in rank_threads({"OMP_WAIT_POLICY": "PASSIVE"}, 2, 2)[1]
