"""Helpers of the engine-level tests: stories260K references and request helpers (their fixtures
live in conftest.py), the leak check every workload ends with, and staggered arrivals."""

from __future__ import annotations

import random

from tram import LLM, SamplingParams
from tram.engine.llm_engine import LLMEngine

PROMPT = "Once upon a time"
GREEDY = SamplingParams(temperature=0, max_tokens=40)
EOS_IDS = {1, 2}  # stories260K stops on </s> (tokenizer eos) and <s> (generation config)


def greedy_ids(llm: LLM, prompt, max_tokens: int = 40) -> list[int]:
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0]
    return out.outputs[0].token_ids


def random_prompt(seed: int, length: int) -> list[int]:
    """A prompt no other test uses, so nothing of it is in the prefix cache yet."""
    rng = random.Random(seed)
    return [1] + [rng.randrange(3, 512) for _ in range(length - 1)]


def drain(engine, max_steps: int = 2000) -> dict[str, list]:
    """Step until nothing is unfinished; every output of every step, per request id."""
    seen: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return seen
        for out in engine.step():
            seen.setdefault(out.request_id, []).append(out)
    raise AssertionError(
        f"engine still has unfinished requests after {max_steps} steps: {list(engine.output_processor.requests)}"
    )


def assert_no_leak(engine: LLMEngine) -> None:
    """After a workload every block is free or cached, and nothing is left in the scheduler."""
    counts = engine.check_kv_integrity()
    assert counts["in_use"] == 0, counts
    assert not engine.engine_core.scheduler.requests
    assert not engine.engine_core.scheduler.running and not engine.engine_core.scheduler.waiting
    assert not engine.has_unfinished_requests()


def run_staggered(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], every: int
) -> list[list[int]]:
    """Add request i at step i * every, then drain; return each request's final tokens."""
    results: dict[str, list[int]] = {}
    pending = list(enumerate(zip(prompts, params)))
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and step >= pending[0][0] * every:
            i, (p, sp) = pending.pop(0)
            engine.add_request(f"req{i}", {"prompt_token_ids": p}, sp)
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        step += 1
        assert step < 2000, "the engine does not drain"
    assert_no_leak(engine)
    return [results[f"req{i}"] for i in range(len(prompts))]
