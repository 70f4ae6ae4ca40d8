"""Benchmark workloads: N requests with prompt and output lengths drawn from ranges under a fixed seed.

The same (seed, ranges, vocabulary) always gives the same requests, so every backend of a run, and
every server measured with `tram bench serve`, sees identical token ids. Prompts are token ids either
drawn uniformly from the vocabulary (random) or cut from a tokenized text file.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def parse_range(text: str) -> tuple[int, int]:
    """'32:512' -> (32, 512) inclusive; '128' -> (128, 128)."""
    parts = text.split(":")
    try:
        lo, hi = int(parts[0]), int(parts[-1])
    except ValueError:
        lo = hi = 0
    if len(parts) > 2 or lo < 1 or hi < lo:
        raise ValueError(f"bad length range {text!r}: expected N or LO:HI with 1 <= LO <= HI")
    return lo, hi


def _special_ids(tokenizer: Any | None) -> set[int]:
    if tokenizer is None:
        return set()
    return set(getattr(tokenizer, "all_special_ids", []) or [])


def random_requests(
    num_requests: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
    exclude_ids: Iterable[int] = (),
) -> list[BenchRequest]:
    """Uniform random token ids; special tokens (bos/eos/...) are left out so none ends a prompt early."""
    rng = random.Random(seed)
    excluded = set(exclude_ids)
    pool = [t for t in range(vocab_size) if t not in excluded]
    if not pool:
        raise ValueError("no token ids left to draw prompts from")
    out = []
    for _ in range(num_requests):
        n = rng.randint(*input_len)
        out.append(BenchRequest([rng.choice(pool) for _ in range(n)], rng.randint(*output_len)))
    return out


def text_file_requests(
    num_requests: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    token_ids: list[int],
    seed: int = 0,
) -> list[BenchRequest]:
    """Windows of a tokenized text, at random offsets (the text is repeated if it is too short)."""
    if not token_ids:
        raise ValueError("the text file tokenized to nothing")
    rng = random.Random(seed)
    stream = token_ids * (-(-input_len[1] // len(token_ids)) + 1)
    out = []
    for _ in range(num_requests):
        n = rng.randint(*input_len)
        start = rng.randrange(0, len(stream) - n + 1)
        out.append(BenchRequest(stream[start : start + n], rng.randint(*output_len)))
    return out


def make_requests(
    num_requests: int,
    input_len: str,
    output_len: str,
    seed: int,
    *,
    tokenizer: Any | None = None,
    vocab_size: int | None = None,
    dataset_path: str | None = None,
) -> list[BenchRequest]:
    """The workload named by the CLI flags (`--num-prompts --input-len --output-len --seed --dataset-path`)."""
    in_range, out_range = parse_range(input_len), parse_range(output_len)
    if dataset_path:
        if tokenizer is None:
            raise ValueError("--dataset-path needs a tokenizer to turn the text into token ids")
        with open(dataset_path, encoding="utf-8") as f:
            ids = tokenizer(f.read(), add_special_tokens=False)["input_ids"]
        return text_file_requests(num_requests, in_range, out_range, ids, seed)
    if vocab_size is None:
        if tokenizer is None:
            raise ValueError("random prompts need a vocabulary size (--vocab-size) or a tokenizer")
        vocab_size = len(tokenizer)
    return random_requests(num_requests, in_range, out_range, vocab_size, seed, _special_ids(tokenizer))


def workload_summary(requests: list[BenchRequest]) -> dict[str, int]:
    return {
        "num_requests": len(requests),
        "prompt_tokens": sum(r.prompt_len for r in requests),
        "output_tokens": sum(r.output_len for r in requests),
    }
