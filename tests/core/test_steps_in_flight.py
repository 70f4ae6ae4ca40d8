"""The scheduler with several steps in flight (pipeline parallelism's batch queue): a request in an
uncollected step sits out later steps and is never preempted; the stages that do not sample get
every new output token once, in order, even across a preemption."""

from __future__ import annotations

from tram.config import CacheConfig, SchedulerConfig
from tram.core.request import Request, RequestStatus
from tram.core.sched_output import ModelRunnerOutput
from tram.core.scheduler import Scheduler
from tram.sampling_params import SamplingParams


def _sched(num_blocks: int = 64, send: bool = True) -> Scheduler:
    return Scheduler(SchedulerConfig(8, 64, 256), CacheConfig(4, num_blocks, False), send_token_ids=send)


def _req(rid: str, n: int = 6) -> Request:
    return Request(rid, list(range(10, 10 + n)), SamplingParams(max_tokens=20, ignore_eos=True), [2], 256)


def test_requests_in_flight_sit_out_the_next_step():
    s = _sched()
    s.add_request(_req("a"))
    first = s.schedule()
    s.add_request(_req("b"))
    second = s.schedule()  # "a" is still in flight: only "b" runs
    assert set(first.num_scheduled_tokens) == {"a"} and set(second.num_scheduled_tokens) == {"b"}
    assert s.schedule().is_empty  # both in flight
    s.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [5]}))
    third = s.schedule()
    assert set(third.num_scheduled_tokens) == {"a"}
    assert [c.new_token_ids for c in third.scheduled_cached_reqs] == [[5]]  # sent once...
    s.update_from_output(second, ModelRunnerOutput(sampled_token_ids={"b": [6]}))
    s.update_from_output(third, ModelRunnerOutput(sampled_token_ids={"a": [7]}))
    fourth = s.schedule()
    assert {c.req_id: c.new_token_ids for c in fourth.scheduled_cached_reqs} == {
        "a": [7],
        "b": [6],
    }  # ...then only what is new


def test_a_request_in_flight_is_never_preempted():
    # 4 blocks of 4 tokens. "a" and then "b" (in flight) take two each; when "a" needs a third, the
    # newest request ("b", the usual victim) is in flight, so "a" preempts itself instead.
    s = _sched(num_blocks=4)
    s.add_request(_req("a", 8))
    first = s.schedule()
    s.add_request(_req("b", 8))
    second = s.schedule()
    assert set(second.num_scheduled_tokens) == {"b"}
    s.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [3]}))
    third = s.schedule()
    assert third.is_empty
    assert s.requests["a"].status == RequestStatus.PREEMPTED and s.waiting[0].request_id == "a"
    assert len(s.kv_cache_manager.groups[0].req_blocks["b"]) == 2  # untouched while its step runs
    s.update_from_output(second, ModelRunnerOutput(sampled_token_ids={"b": [4]}))
    assert s.kv_cache_manager.check_integrity()["in_use"] == 2


def test_without_pipeline_no_tokens_are_sent():
    s = _sched(send=False)
    s.add_request(_req("a"))
    s.update_from_output(s.schedule(), ModelRunnerOutput(sampled_token_ids={"a": [5]}))
    assert [c.new_token_ids for c in s.schedule().scheduled_cached_reqs] == [[]]
