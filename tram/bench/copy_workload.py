"""A copy-heavy workload for speculative decoding, built from a real model's own outputs: the model
tells a story from a short opening, and the prompt is that opening and the story, then the opening
again as the start of the next document (the tokenizer puts BOS before it, as the model saw stories
in training), so that the continuation (the requested output) retells what the prompt holds, as an
edit of a file repeats most of it. Each request asks for as many tokens as the retelling has.

Needs a real model and its tokenizer (stories260K here): a random-weight preset's outputs copy nothing.
"""

from __future__ import annotations

import random
from typing import Any

from tram.bench.datasets import BenchRequest

NAMES = ("Lily", "Tom", "Sue", "Max", "Ben", "Mia", "Sam", "Anna", "Tim", "Lucy", "Jack", "Zoe")
OPENINGS = (
    "Once upon a time, {a}",
    "{a} had a big",
    "One day, {a} went to the",
    "{a} and {b} were",
    "{a} saw a little",
    "There was a girl named {a}. She",
    "{a} liked to play with",
    "It was a sunny day. {a}",
)


def copy_requests(
    llm: Any, num_requests: int, max_story_tokens: int, seed: int = 0, retellings: int = 4
) -> list[BenchRequest]:
    """`num_requests` prompts from stories `llm` (a Tram `LLM`) tells greedily, at most max_story_tokens
    each. Each story is then shown and retold `retellings` times, the retelling becoming the story
    shown: a small model retells what it is shown only in part, and its own retelling of a retelling
    converges to text it copies (the workload then measures copying, not the model's memory)."""
    from tram import SamplingParams

    rng = random.Random(seed)
    openings = []
    for _ in range(num_requests):
        a, b = rng.sample(NAMES, 2)
        openings.append(rng.choice(OPENINGS).format(a=a, b=b))
    tokenizer = llm.get_tokenizer()
    heads = [tokenizer.encode(o) for o in openings]
    params = SamplingParams(temperature=0, max_tokens=max_story_tokens)
    stories = [list(o.outputs[0].token_ids) for o in llm.generate(openings, params, use_tqdm=False)]
    for _ in range(retellings + 1):
        prompts = [head + story + head for head, story in zip(heads, stories)]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        retold = [list(o.outputs[0].token_ids) for o in outs]
        requests = [BenchRequest(p, max(1, len(r))) for p, r in zip(prompts, retold)]
        stories = retold
    return requests
