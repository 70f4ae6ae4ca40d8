"""Helpers of the engine-level API tests on stories260K (their fixtures live in conftest.py)."""
from __future__ import annotations

import random

from tram import LLM, SamplingParams

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
    raise AssertionError(f"engine still has unfinished requests after {max_steps} steps: "
                         f"{list(engine.output_processor.requests)}")
