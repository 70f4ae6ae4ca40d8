"""The transformers peers of `tram bench throughput` (and of benchmarks/gpu_bench.py): static batching
and transformers' own continuous batching.

Both generate exactly each request's output length, greedy, with end-of-sequence switched off, so
their output token counts equal Tram's and tokens/s compare like with like.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tram.bench.datasets import BenchRequest
from tram.bench.timing import sync

# requests -> generated token ids, one list per request, in order
GenerateFn = Callable[[list[BenchRequest]], list[list[int]]]
_PAD_ID = 0  # these models have no pad token; any id works under the attention mask


def _no_eos_config(max_new_tokens: int) -> Any:
    from transformers import GenerationConfig

    # A config replacing the model's outright: generate() would otherwise merge its eos ids back in.
    return GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, bos_token_id=None, pad_token_id=_PAD_ID
    )


def load_hf_model(model: Any, dtype: str, attn_implementation: str, device: str | torch.device = "cpu") -> Any:
    """A transformers model in eval mode: a checkpoint's weights (`model` a path or hub id), or random
    ones from a config alone (`model` a PretrainedConfig), initialised on `device` itself: an 8B model
    initialised on the host first would take minutes."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=getattr(torch, dtype), attn_implementation=attn_implementation)
    if isinstance(model, str):
        net = AutoModelForCausalLM.from_pretrained(model, **kwargs)
    else:
        with torch.device(device):
            net = AutoModelForCausalLM.from_config(model, **kwargs)
    return net.to(device).eval()


def hf_static_backend(model_path: str, dtype: str, batch_size: int) -> GenerateFn:
    """transformers `generate` on left-padded batches in arrival order: every batch runs until its
    longest request is done, the classic static batching that continuous batching replaces."""
    model = load_hf_model(model_path, dtype, "sdpa")

    @torch.inference_mode()
    def generate(requests: list[BenchRequest]) -> list[list[int]]:
        outputs: list[list[int]] = []
        for start in range(0, len(requests), batch_size):
            chunk = requests[start : start + batch_size]
            width = max(r.prompt_len for r in chunk)
            ids = torch.tensor([[_PAD_ID] * (width - r.prompt_len) + r.prompt_token_ids for r in chunk])
            mask = torch.tensor([[0] * (width - r.prompt_len) + [1] * r.prompt_len for r in chunk])
            longest = max(r.output_len for r in chunk)
            model.generation_config = _no_eos_config(longest)
            out = model.generate(input_ids=ids, attention_mask=mask)  # [B, width + longest]
            # Tokens past a request's own length were computed but not asked for: not counted.
            outputs.extend(row[width : width + r.output_len].tolist() for row, r in zip(out, chunk))
        return outputs

    return generate


@dataclass
class CBRun:
    """One batch of requests through transformers' continuous batching."""

    outputs: list[list[int]]  # generated ids per request, in order; [] for one unfinished at the deadline
    finished: int
    timed_out: bool
    setup_seconds: float  # entering the manager: cache sizing, warm-up, CUDA graphs (first run only)
    seconds: float  # from the first request added to the last result collected
    attn_implementation: str  # after the manager's own switch, if it made one
    use_cuda_graph: str

    @property
    def output_tokens(self) -> int:
        return sum(map(len, self.outputs))


class HFContinuousBatching:
    """transformers' continuous batching manager (`continuous_batching_context_manager`, paged attention).

    The manager persists between runs (its warm-up is paid once, like Tram's LLM construction, and
    reported as the first run's setup_seconds); `close()` destroys it. `size_for_workload` passes the
    requests' shape as workload hints, as `generate_batch` does: right for one big timed run, wrong
    where a small warm-up run comes first (the manager would be sized for the warm-up).
    """

    def __init__(
        self,
        model: Any,
        *,
        num_blocks: int | None = None,
        max_batch_tokens: int | None = None,
        auto_switch_to_flash: bool | None = None,
        size_for_workload: bool = False,
    ) -> None:
        self.model, self.size_for_workload = model, size_for_workload
        self.gen_config = _no_eos_config(1)  # each request brings its own max_new_tokens
        self.gen_config.eos_token_id = -1  # the manager's way of saying "no eos"
        # Only what was asked for: transformers' defaults otherwise.
        self.cb_kwargs = {
            k: v
            for k, v in dict(
                num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, auto_switch_to_flash=auto_switch_to_flash
            ).items()
            if v is not None
        }
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)

    def run(self, requests: list[BenchRequest], timeout: float | None = None, deadline: float | None = None) -> CBRun:
        """Generate every request. Past `timeout` seconds after the first request is added, or past
        `deadline` (a perf_counter time), stop and count the finished ones."""
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        start = time.perf_counter()
        with self.model.continuous_batching_context_manager(
            generation_config=self.gen_config,
            continuous_batching_config=ContinuousBatchingConfig(
                **known_fields(ContinuousBatchingConfig, self.cb_kwargs)
            ),
            block=True,
            timeout=60,
            persistent_manager=True,
            workload_hints=self._hints(requests),
        ) as manager:
            setup = time.perf_counter() - start
            attn = self.model.config._attn_implementation  # as switched by the manager; stop() switches back
            graphs = str(getattr(manager.continuous_batching_config, "use_cuda_graph", None))
            clean = False
            try:
                sync(self.model.device)
                start = time.perf_counter()
                limit = min(
                    start + timeout if timeout is not None else math.inf, deadline if deadline is not None else math.inf
                )
                ids = [
                    manager.add_request(r.prompt_token_ids, request_id=f"bench-{i}", max_new_tokens=r.output_len)
                    for i, r in enumerate(requests)
                ]
                results, timed_out = collect_results(manager, len(ids), limit)
                seconds = time.perf_counter() - start
                clean = not timed_out
            finally:
                if not clean:  # a timeout or an error: drop what is still running rather than wait for it
                    manager.stop(block=True, timeout=60, hard_stop=True)
        outputs = [list(results[i].generated_tokens) if i in results else [] for i in ids]
        return CBRun(outputs, len(results), timed_out, setup, seconds, attn, graphs)

    def _hints(self, requests: list[BenchRequest]) -> Any:
        if not self.size_for_workload:
            return None
        from transformers.generation.continuous_batching.utils import WorkloadHints

        return WorkloadHints(
            max_prompt_length=max(r.prompt_len for r in requests),
            max_generated_length=max(r.output_len for r in requests),
            num_requests=len(requests),
        )

    def close(self) -> None:
        self.model.destroy_cached_continuous_batching_manager()


def known_fields(config_cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs that this transformers version's config class has fields for (auto_switch_to_flash
    came after 5.17, the version on the GPU machines); the others are logged and left out."""
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set(kwargs)
    dropped = sorted(set(kwargs) - names)
    if dropped:
        logging.getLogger(__name__).info("transformers' %s has no %s: left out", config_cls.__name__, dropped)
    return {k: v for k, v in kwargs.items() if k in names}


def collect_results(manager: Any, num: int, deadline: float = math.inf) -> tuple[dict[str, Any], bool]:
    """({request id: finished result}, timed out) from the manager's result queue; `deadline` is a
    perf_counter time."""
    results: dict[str, Any] = {}
    while len(results) < num:
        if time.perf_counter() > deadline:
            return results, True
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching loop stopped before all requests finished")
            continue
        if result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"transformers request {result.request_id} failed: {result.error}")
            results[result.request_id] = result
    return results, False


def hf_cb_backend(
    model_path: str,
    dtype: str,
    attn_implementation: str = "paged|sdpa",
    max_batch_tokens: int | None = None,
    num_blocks: int | None = None,
) -> GenerateFn:
    """transformers' continuous batching, each request with its own max_new_tokens."""
    cb = HFContinuousBatching(
        load_hf_model(model_path, dtype, attn_implementation), max_batch_tokens=max_batch_tokens, num_blocks=num_blocks
    )

    def generate(requests: list[BenchRequest]) -> list[list[int]]:
        return cb.run(requests).outputs

    return generate
