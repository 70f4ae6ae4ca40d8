"""The engine core's side of structured outputs: building the manager at start-up and reporting its
counters with the scheduler's stats."""

from __future__ import annotations

import logging
import time

from tram.config import EngineConfig
from tram.engine.messages import SchedulerStats
from tram.engine.tokenizer import get_stop_token_ids, load_tokenizer
from tram.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)
# A step with nothing to run but grammars compiling sleeps until one is done, at most this long, so
# the core neither spins nor keeps new requests waiting.
GRAMMAR_POLL_S = 0.01
COMPILE_THREADS = 2


def make_structured_output_manager(config: EngineConfig) -> StructuredOutputManager | None:
    """The grammar engine needs the vocabulary here, in the engine core: it is loaded once, now,
    not on the first constrained request. None without a tokenizer (skip_tokenizer_init)."""
    if config.skip_tokenizer_init:
        return None
    start = time.perf_counter()
    mc = config.model_config
    tokenizer = load_tokenizer(config.tokenizer, config.revision, config.trust_remote_code)
    stop_ids = get_stop_token_ids(mc.model, tokenizer, mc.hf_config)
    manager = StructuredOutputManager(
        config.structured_outputs_backend,
        tokenizer,
        mc.vocab_size,
        stop_ids,
        config.scheduler_config.max_num_seqs,
        config.structured_outputs_compile_timeout,
        COMPILE_THREADS,
        config.structured_outputs_disable_any_whitespace,
    )
    logger.info(
        "Structured outputs: %s over a %d-token vocabulary, ready in %.2f s",
        manager.backend.name,
        mc.vocab_size,
        time.perf_counter() - start,
    )
    return manager


def add_structured_output_stats(
    stats: SchedulerStats, manager: StructuredOutputManager, take_compile_times: bool = True
) -> None:
    s = manager.stats
    stats.structured_output_requests = s.requests
    stats.grammar_compile_failures = s.compile_failures
    stats.grammar_cache_hits = s.cache_hits
    if take_compile_times:
        stats.grammar_compile_seconds = s.take_compile_seconds()
