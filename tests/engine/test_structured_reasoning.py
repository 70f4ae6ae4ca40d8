"""A thinking model's constraint waits for the end of its thinking (vLLM's behaviour): while the
request thinks, the manager sends no bitmask row for it, its grammar accepts no token and cannot end
it; the tokens that end the thinking (a sequence, as gpt-oss's) switch the grammar on."""

from __future__ import annotations

import numpy as np

from tram import LLM, SamplingParams, StructuredOutputsParams
from tram.core.request import Request
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.engine.structured_outputs import make_structured_output_manager

END = [9, 10]  # the tokens that end the thinking


def _step(manager, req: Request, token: int | None) -> list[str]:
    """One step for `req`: the ids the bitmask has rows for; then the grammar advances by `token`."""
    sched = SchedulerOutput(num_scheduled_tokens={req.request_id: 1}, total_num_scheduled_tokens=1)
    manager.fill_bitmask(sched, {req.request_id: req})
    rows = sched.grammar_bitmask.req_ids if sched.grammar_bitmask is not None else []
    if token is not None:
        manager.advance(sched, ModelRunnerOutput(sampled_token_ids={req.request_id: [token]}), {req.request_id: req})
    return rows


def test_the_grammar_applies_only_after_the_thinking_ends(llm: LLM) -> None:
    manager = make_structured_output_manager(llm.llm_engine.engine_core.config)
    assert manager is not None
    try:
        params = StructuredOutputsParams(choice=["Tom", "Lily"], reasoning_end=END)
        req = Request("r", [1, 5, 6], SamplingParams(max_tokens=8), [2], 128)
        req.structured_output = state = manager.new_request("r", params)
        assert manager.wait_compiled(["r"]) is None and state.is_ready()
        req.num_computed_tokens = 3
        # Thinking: tokens the grammar would refuse (9 alone, then 2, the stop token) pass freely,
        # and the finished-looking grammar does not end the request.
        for token in (9, 2, 9):
            assert _step(manager, req, token) == []
            assert state.thinking and state.last_token is None and not state.rejected
            assert not state.is_terminated()
        assert _step(manager, req, 10) == []  # 9 then 10: the thinking has ended
        assert not state.thinking
        rows = _step(manager, req, None)
        assert rows == ["r"]  # the grammar's row from the next token on
        bits = np.unpackbits(np.frombuffer(manager.bitmask[0].tobytes(), dtype=np.uint8), bitorder="little")
        assert 0 < int(bits.sum()) < 64  # only what can begin "Tom" or "Lily"
    finally:
        manager.shutdown()


def test_without_reasoning_end_the_grammar_applies_at_once(llm: LLM) -> None:
    manager = make_structured_output_manager(llm.llm_engine.engine_core.config)
    assert manager is not None
    try:
        req = Request("p", [1, 5, 6], SamplingParams(max_tokens=8), [2], 128)
        req.structured_output = manager.new_request("p", StructuredOutputsParams(choice=["Tom", "Lily"]))
        assert manager.wait_compiled(["p"]) is None and req.structured_output.is_ready()
        req.num_computed_tokens = 3
        assert not req.structured_output.thinking
        assert _step(manager, req, None) == ["p"]
    finally:
        manager.shutdown()
