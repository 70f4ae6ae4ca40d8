"""What the output processor remembers of a request, and how that becomes a `RequestOutput` of the
request's `RequestOutputKind`.

The cost of an output never depends on the length already generated, except for CUMULATIVE, which
copies everything so far by definition:
- DELTA hands over the lists of what arrived since the last output and starts new ones (no copy);
  its text is the detokenizer's delta.
- FINAL_ONLY appends (amortised O(new)) and builds one output, at the end, from the lists as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tram.engine.detokenizer import IncrementalDetokenizer
from tram.outputs import CompletionOutput, PromptLogprobs, RequestMetrics, RequestOutput, SampleLogprobs
from tram.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class SampleState:
    """One of the n samples of a request (a child request in the core).

    `token_ids` and `logprobs` hold what the next output carries: everything so far for CUMULATIVE
    and FINAL_ONLY, only what is new since the previous output for DELTA.
    """

    index: int
    detokenizer: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs | None = None  # None unless the request asked for logprobs
    cumulative_logprob: float | None = None  # the running total in every kind, as in vLLM
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    has_news: bool = False  # tokens or a finish that no output has carried yet

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def take_delta(self) -> CompletionOutput:
        """What is new since the last output; the lists go to the output, new ones start here."""
        text = self.detokenizer.get_next_output_text(self.finished, delta=True) if self.detokenizer else ""
        out = CompletionOutput(
            self.index,
            text,
            self.token_ids,
            self.cumulative_logprob,
            self.logprobs,
            self.finish_reason,
            self.stop_reason,
        )
        self.token_ids = []
        if self.logprobs is not None:
            self.logprobs = []
        self.has_news = False
        return out

    def snapshot(self, copy: bool) -> CompletionOutput:
        """Everything so far; `copy` when this state lives on and keeps appending to its lists.

        Unfinished text withholds a possible stop-string prefix, so cumulative text never shrinks.
        """
        text = self.detokenizer.get_next_output_text(self.finished, delta=False) if self.detokenizer else ""
        token_ids, logprobs = self.token_ids, self.logprobs
        if copy:
            token_ids = list(token_ids)
            logprobs = None if logprobs is None else list(logprobs)
        self.has_news = False
        return CompletionOutput(
            self.index, text, token_ids, self.cumulative_logprob, logprobs, self.finish_reason, self.stop_reason
        )


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: dict[str, SampleState]  # core request id -> sample, in index order
    metrics: RequestMetrics
    prompt_logprobs: PromptLogprobs | None = None  # None unless the request asked for them
    # What each prompt token adds to the prompt's text, and the ids held before some (see the
    # detokenizer's last_texts and last_pending): for prompt logprobs.
    prompt_texts: list[str] | None = None
    prompt_pending: dict[int, list[int]] | None = None
    num_cached_tokens: int = 0
    prompt_logprobs_sent: bool = False  # DELTA sends them once, complete
    num_finished: int = 0  # samples with a finish reason (counted, not searched, every step)

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.samples)

    def prompt_logprobs_pending(self) -> bool:
        """Prompt logprobs were asked for and some positions have not arrived yet."""
        lps = self.prompt_logprobs
        return lps is not None and len(lps) < len(self.prompt_token_ids)

    def make_output(self, finished: bool) -> RequestOutput | None:
        """The output this step owes the caller (`finished`: the request is), or None when it owes none."""
        kind = self.params.output_kind
        if kind == RequestOutputKind.DELTA:
            return self._delta_output(finished)
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        copy = kind == RequestOutputKind.CUMULATIVE
        completions = [s.snapshot(copy) for s in self.samples.values()]
        prompt_logprobs = self.prompt_logprobs
        if copy and self.prompt_logprobs_pending():
            prompt_logprobs = list(prompt_logprobs)  # later chunks of the prefill extend the list
        return self._output(completions, prompt_logprobs, finished)

    def _delta_output(self, finished: bool) -> RequestOutput | None:
        # Prompt logprobs come in one piece with the first output, so with chunked prefill the
        # request says nothing until they are complete (its tokens wait in the lists meanwhile).
        if self.prompt_logprobs_pending() and not finished:
            return None
        completions = [s.take_delta() for s in self.samples.values() if s.has_news]
        if not completions:
            return None
        prompt_logprobs = None
        if not self.prompt_logprobs_sent:
            prompt_logprobs, self.prompt_logprobs_sent = self.prompt_logprobs, True
        return self._output(completions, prompt_logprobs, finished)

    def _output(
        self, completions: list[CompletionOutput], prompt_logprobs: PromptLogprobs | None, finished: bool
    ) -> RequestOutput:
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            completions,
            finished,
            prompt_logprobs,
            self.num_cached_tokens,
            self.metrics,
        )
