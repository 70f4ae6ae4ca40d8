"""The structured-output manager's two beats in the engine core's step: `fill_bitmask` before the
step runs and `advance` after it, each touching only the constrained requests that sample."""

from __future__ import annotations

import numpy as np

from tram import LLM, SamplingParams, StructuredOutputsParams
from tram.core.request import Request
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.engine.structured_outputs import make_structured_output_manager


def _allowed(bitmask_row: np.ndarray) -> list[int]:
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")
    return np.flatnonzero(bits).tolist()


def test_fill_bitmask_and_advance_touch_only_the_constrained_requests_that_sample(llm: LLM) -> None:
    manager = make_structured_output_manager(llm.llm_engine.engine_core.config)
    assert manager is not None
    try:
        params = StructuredOutputsParams(choice=["Tom", "Lily"])
        reqs: dict[str, Request] = {}
        for rid in ("sampling", "prefilling", "unscheduled", "finished"):
            req = Request(rid, [1, 5, 6], SamplingParams(max_tokens=4), [2], 128)
            req.structured_output = manager.new_request(rid, params)
            reqs[rid] = req
        reqs["plain"] = Request("plain", [1, 5, 6], SamplingParams(max_tokens=4), [2], 128)
        assert manager.wait_compiled(reqs) is None
        assert all(r.structured_output.is_ready() for r in reqs.values() if r.structured_output is not None)
        del reqs["finished"]  # aborted while its step ran: skipped, as the scheduler skips it
        reqs["sampling"].num_computed_tokens = 3  # its prompt is computed after this step: it samples
        reqs["prefilling"].num_computed_tokens = 2  # a chunk of its prompt: no sample yet
        reqs["plain"].num_computed_tokens = 3
        sched = SchedulerOutput(
            num_scheduled_tokens={"sampling": 3, "prefilling": 2, "plain": 3}, total_num_scheduled_tokens=8
        )

        manager.fill_bitmask(sched, reqs)
        mask = sched.grammar_bitmask
        assert mask is not None and mask.req_ids == ["sampling"]
        allowed = _allowed(np.frombuffer(mask.data, dtype=np.int32))
        assert 0 < len(allowed) < 64
        token = allowed[0]

        result = ModelRunnerOutput(
            sampled_token_ids={"sampling": [token], "plain": [7], "unscheduled": [token], "finished": [token]}
        )
        manager.advance(sched, result, reqs)
        states = {rid: r.structured_output for rid, r in reqs.items()}
        assert states["sampling"].last_token == token and not states["sampling"].rejected
        assert states["prefilling"].last_token is None and states["unscheduled"].last_token is None
    finally:
        manager.shutdown()
