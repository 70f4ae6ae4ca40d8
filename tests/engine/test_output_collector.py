"""AsyncLLM's OutputCollector: a consumer that falls behind gets DELTA outputs merged (nothing
dropped, in order, n samples kept apart), and only the newest CUMULATIVE one."""

from __future__ import annotations

import asyncio

import pytest

from tram.engine.async_llm import OutputCollector, RequestFailedError
from tram.outputs import CompletionOutput, Logprob, RequestOutput, merge_deltas

PROMPT_LPS = [None, {7: Logprob(-1.0, 1, "x")}]


def delta(
    index: int, text: str, ids: list[int], finish: str | None = None, finished: bool = False, prompt_logprobs=None
) -> RequestOutput:
    lps = [{t: Logprob(-0.1 * t, 1, str(t))} for t in ids]
    c = CompletionOutput(index, text, ids, -0.1 * sum(ids), lps, finish, "." if finish else None)
    return RequestOutput("r", "p", [1, 7], [c], finished, prompt_logprobs)


def test_merged_deltas_equal_their_concatenation():
    parts = [
        delta(0, "Once", [5], prompt_logprobs=PROMPT_LPS),
        delta(1, "Tom", [9]),
        delta(0, " upon", [6, 8]),
        delta(1, "", [3]),  # text held back, tokens new
        delta(0, " a", [4], finish="stop"),
        delta(1, " ran", [2], finish="length", finished=True),
    ]
    merged = merge_deltas(parts)
    assert merged.finished and merged.prompt_logprobs == PROMPT_LPS
    zero, one = merged.outputs
    assert (zero.index, zero.text, zero.token_ids) == (0, "Once upon a", [5, 6, 8, 4])
    assert (one.index, one.text, one.token_ids) == (1, "Tom ran", [9, 3, 2])
    assert [list(row) for row in zero.logprobs] == [[5], [6], [8], [4]]
    assert (zero.finish_reason, zero.stop_reason, zero.cumulative_logprob) == ("stop", ".", pytest.approx(-0.4))
    assert (one.finish_reason, one.cumulative_logprob) == ("length", pytest.approx(-0.2))
    # The parts themselves are left as they were.
    assert parts[0].outputs[0].token_ids == [5] and parts[0].outputs[0].text == "Once"


def test_collector_merges_deltas_for_a_slow_consumer():
    async def scenario() -> list[RequestOutput]:
        collector = OutputCollector(aggregate=True)
        collector.put(delta(0, "a", [1], prompt_logprobs=PROMPT_LPS))
        first = await collector.get()
        for i, text in enumerate("bcde"):
            collector.put(delta(0, text, [i + 2], finished=text == "e"))
        return [first, await collector.get()]

    first, rest = asyncio.run(scenario())
    assert first.outputs[0].text == "a" and first.prompt_logprobs == PROMPT_LPS
    assert rest.outputs[0].text == "bcde" and rest.outputs[0].token_ids == [2, 3, 4, 5]
    assert rest.finished and rest.prompt_logprobs is None


def test_cumulative_collector_keeps_the_newest_and_errors_win():
    async def scenario() -> tuple[RequestOutput, BaseException]:
        collector = OutputCollector()
        collector.put(delta(0, "a", [1]))
        collector.put(delta(0, "ab", [1, 2]))
        newest = await collector.get()
        collector.put(delta(0, "abc", [1, 2, 3]))
        collector.fail(RequestFailedError("boom"))
        with pytest.raises(RequestFailedError) as e:
            await collector.get()
        return newest, e.value

    newest, error = asyncio.run(scenario())
    assert newest.outputs[0].text == "ab" and str(error) == "boom"
