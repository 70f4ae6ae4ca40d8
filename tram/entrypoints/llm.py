"""The offline API, shaped like vLLM's `LLM` so users switch by changing an import."""

from __future__ import annotations

# First, before anything below imports torch: libgomp reads its wait policy once, when torch loads it.
from tram.entrypoints import offline_threads  # isort: skip

import itertools
from collections.abc import Sequence
from typing import Any

import msgspec
from tqdm.auto import tqdm

from tram.config import EngineArgs
from tram.engine.engine_config import create_engine_config
from tram.engine.input_processor import PromptType
from tram.engine.llm_engine import LLMEngine
from tram.engine.tokenizer import apply_chat_template
from tram.outputs import RequestOutput
from tram.sampling_params import RequestOutputKind, SamplingParams

Messages = list[dict[str, Any]]


class LLM:
    """Generate from a Hugging Face model with a paged KV cache and continuous batching.

    Engine arguments use vLLM's names: max_model_len, max_num_seqs, max_num_batched_tokens,
    block_size, enable_prefix_caching, num_gpu_blocks_override, gpu_memory_utilization,
    kv_cache_memory_bytes, dtype, seed, load_format, attention_backend, tokenizer, revision.

    On the CPU the model runs in this process, with the threads and the OpenMP wait policy that
    `tram serve` gives its engine core (tram/executor/cpu_threads.py): every usable core while no
    other process is busy and one fewer while one is (tram/executor/cpu_share.py watches), unless
    TRAM_CPU_THREADS or OMP_NUM_THREADS says otherwise or the program called torch.set_num_threads
    after importing Tram. Building an LLM sets this process's torch thread count
    (`cpu_thread_policy` says what and why; entrypoints/offline_threads.py).
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        config = create_engine_config(EngineArgs.from_kwargs(model, **kwargs))
        # The device decides whose threads these are; the weights load with them too, so set them first.
        config.model_config.resolve()
        self.cpu_thread_policy = offline_threads.apply(config)
        self.llm_engine = LLMEngine(config)
        self._counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = self._params_per_prompt(sampling_params, len(prompts))
        # Validate everything first so a bad prompt leaves nothing half-queued.
        processed = [self.llm_engine.process_input(p, sp) for p, sp in zip(prompts, params)]
        return self._run(processed, params, use_tqdm)

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template to one conversation or a list of them, then generate. `tools`
        (OpenAI tool dicts) go to the template, as vLLM's; the calls are in the generated text."""
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer; this LLM was created with skip_tokenizer_init")
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts: list[PromptType] = []
        for conv in convs:
            ids = apply_chat_template(
                tokenizer,
                conv,
                chat_template,
                add_generation_prompt,
                **({"tools": tools} if tools else {}),
                **(chat_template_kwargs or {}),
            )
            prompts.append({"prompt_token_ids": ids, "prompt": tokenizer.decode(ids)})
        return self.generate(prompts, sampling_params, use_tqdm)

    @staticmethod
    def _params_per_prompt(
        sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int
    ) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        params = list(sampling_params)
        if len(params) != n:
            raise ValueError(f"got {len(params)} sampling_params for {n} prompts; pass one or one per prompt")
        return params

    def _run(
        self, processed: list[tuple[str | None, list[int]]], params: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        ids = [str(next(self._counter)) for _ in processed]
        results: dict[str, RequestOutput] = {}
        try:
            for rid, (text, token_ids), sp in zip(ids, processed, params):
                engine.add_processed_request(rid, text, token_ids, _final_only(sp))
            with tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True) as bar:
                num_out_tokens = 0
                while engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.finished:
                            results[out.request_id] = out
                            num_out_tokens += sum(len(c.token_ids) for c in out.outputs)
                            bar.update(1)
                            bar.set_postfix_str(
                                f"output {num_out_tokens / max(bar.format_dict['elapsed'], 1e-9):.1f} toks/s"
                            )
        except BaseException:
            engine.abort_request([rid for rid in ids if rid not in results])
            raise
        return [results[rid] for rid in ids]


def _final_only(params: SamplingParams) -> SamplingParams:
    """The caller's params asking for one output per request; theirs stay untouched."""
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return params
    return msgspec.structs.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
