"""The engine core's structured-output manager: compiles grammars off the step loop, caches them by
their text, and fills the step's token bitmask for the constrained requests that sample.

A new constrained request waits in the scheduler's queue until its grammar is ready (the scheduler
asks `is_ready`, never waits); compiles run off it (compile_pool.py: xgrammar's in child processes,
killed once no request waits for them). A compile that fails, or is still running at its deadline,
fails that request alone. The bitmask is built after scheduling and travels to the worker in the
SchedulerOutput, so the worker needs no grammar engine; a step with no constrained request to
sample sends none and costs nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import msgspec
import numpy as np

from tram.core.request import Request
from tram.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import GrammarCompileError, make_backend
from tram.structured_output.compile_pool import CompilePool
from tram.structured_output.json_closing import ClosingMasks, narrow_to_closing
from tram.structured_output.request import StructuredOutputRequest

logger = logging.getLogger(__name__)
CACHE_ENTRIES = 512  # compiled grammars kept (least recently used go first)
# Steps before its budget ends from which a JSON request is watched for a closing (json_closing.py);
# a closing longer than this (JSON nested ~30 deep) is not forced.
CLOSING_WINDOW = 32
CLOSING_KINDS = ("json", "json_object")  # the constraints whose output is closed in time


class StructuredOutputStats:
    """Running totals for Prometheus, plus compile times not yet reported."""

    def __init__(self) -> None:
        self.requests = 0
        self.compile_failures = 0
        self.cache_hits = 0
        self.compile_seconds: list[float] = []

    def add_compile(self, seconds: float) -> None:
        self.compile_seconds.append(seconds)

    def take_compile_seconds(self) -> list[float]:
        out, self.compile_seconds = self.compile_seconds, []
        return out


class StructuredOutputManager:
    def __init__(
        self,
        backend: str,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
        max_num_seqs: int,
        compile_timeout: float,
        num_threads: int = 2,
        disable_any_whitespace: bool = False,
    ) -> None:
        self.backend = make_backend(backend, tokenizer, vocab_size, stop_token_ids, num_threads)
        self.compile_timeout = compile_timeout
        self.disable_any_whitespace = disable_any_whitespace  # the server's default for JSON constraints
        prove = self._prove if self.backend.proves_in_child else None
        self.stats = StructuredOutputStats()
        # Child processes and threads: see there.
        self.pool = CompilePool(self._finish, prove, num_threads, observe=self.stats.add_compile)
        self.cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self.pending: dict[str, StructuredOutputRequest] = {}  # request id -> still compiling
        self.pending_keys: dict[str, tuple[str, str]] = {}  # request id -> the grammar it waits for
        self.key_waiters: Counter[tuple[str, str]] = Counter()  # grammar -> pending requests for it
        self.live: set[str] = set()  # constrained requests not yet seen finished
        self.words = -(-vocab_size // 32)
        self.tokenizer = tokenizer
        self.closing = ClosingMasks(tokenizer, vocab_size, self.words)
        self.closing_ids: set[str] = set()  # JSON requests closing before their budget ends
        # Every word -1: all tokens allowed; rows are overwritten by the matchers that fill them.
        self.bitmask = np.full((max_num_seqs, self.words), -1, dtype=np.int32)

    # ---- requests in -----------------------------------------------------------------------
    def new_request(self, request_id: str, params: StructuredOutputsParams) -> StructuredOutputRequest:
        if self.disable_any_whitespace and not params.disable_any_whitespace:
            params = msgspec.structs.replace(params, disable_any_whitespace=True)
        key = params.key()
        deadline = time.monotonic() + self.compile_timeout
        future = self.cache.get(key)
        failed = future is not None and future.done() and future.exception() is not None
        if future is not None and not failed:
            self.cache.move_to_end(key)
            self.stats.cache_hits += 1
        if future is None or failed or not future.done():
            # A new compile, or this request joins the one in flight (and may extend its deadline).
            future = self.pool.submit(key, params, request_id, deadline)
            self.cache[key] = future
            while len(self.cache) > CACHE_ENTRIES:
                self.cache.popitem(last=False)
        self.stats.requests += 1
        self.live.add(request_id)
        state = StructuredOutputRequest(params, future, self.backend, deadline)
        if not state.is_ready():
            self.pending[request_id] = state
            self.pending_keys[request_id] = key
            self.key_waiters[key] += 1
        return state

    def forget(self, request_ids: Iterable[str]) -> None:
        """These requests wait for no grammar any more (failed, aborted, or theirs is ready): a
        compile that no other request waits for is dropped, its child process killed."""
        for rid in request_ids:
            self.pending.pop(rid, None)
            key = self.pending_keys.pop(rid, None)
            if key is None:
                continue
            self.pool.release(key, rid)
            self.key_waiters[key] -= 1
            if self.key_waiters[key] <= 0:
                del self.key_waiters[key]
                self._uncache_unless_compiled(key)

    def _uncache_unless_compiled(self, key: tuple[str, str]) -> None:
        """The cache keeps compiled grammars only: a failed or abandoned compile's entry (its key
        holds the whole schema text, hundreds of KB for the schemas that fail) goes."""
        future = self.cache.get(key)
        if future is not None and not (future.done() and future.exception() is None):
            del self.cache[key]

    def _prove(self, params: StructuredOutputsParams) -> Any:
        """In a compile's child process: the backend's proof."""
        return _as_compile_error(params, self.backend.prove, params)

    def _finish(self, params: StructuredOutputsParams, proof: Any) -> Any:
        """On a compile thread: the grammar the requests use, compiled here (from the proof, if any)."""
        if proof is None:
            return _as_compile_error(params, self.backend.compile, params)
        return _as_compile_error(params, self.backend.compile_proven, proof)

    def take_failures(self, live: dict[str, Request]) -> list[tuple[str, GrammarCompileError]]:
        """Requests whose grammar failed or timed out (their ids, and why); forgets ready or gone ones."""
        failed = []
        now = time.monotonic()
        done = []
        for rid, state in self.pending.items():
            if rid not in live:
                done.append(rid)
                continue
            error = state.failure(now)
            if error is not None:
                failed.append((rid, error))
                self.stats.compile_failures += 1
                done.append(rid)
            elif state.is_ready():
                done.append(rid)
        self.forget(done)
        return failed

    def wait_for_compiles(self, timeout: float) -> None:
        """Called when a step had nothing to run: sleep until a compile finishes, not spin."""
        futures = {s.compiled for s in self.pending.values()}
        if futures:
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    def wait_compiled(self, request_ids: Iterable[str], timeout: float | None = None) -> GrammarCompileError | None:
        """Offline callers validate at submission: block until these compiles end; their error."""
        for rid in request_ids:
            state = self.pending.get(rid)
            if state is None:
                continue
            remaining = max(0.0, state.deadline - time.monotonic()) if timeout is None else timeout
            wait([state.compiled], timeout=remaining)
            error = state.failure()
            if error is not None:
                return error
        return None

    # ---- one step --------------------------------------------------------------------------
    def fill_bitmask(self, sched: SchedulerOutput, requests: dict[str, Request]) -> None:
        """Before the step runs: give `sched` the rows its constrained requests sample with."""
        sched.grammar_bitmask = self.grammar_bitmask(sched, requests)

    def advance(
        self, sched: SchedulerOutput, result: ModelRunnerOutput, requests: dict[str, Request]
    ) -> list[tuple[str, GrammarCompileError]]:
        """After the step ran: move each constrained request's grammar past the tokens it sampled.
        Called before the scheduler's update, whose stop check asks the grammar if it has ended.
        Requests finished while the step ran are gone from `requests` and skipped, as there.
        A grammar that ends (or refuses a token) partway through a step's tokens, as a verified run
        of drafts can, cuts the request's tokens there: the stop check then ends it at that token.
        Returns the requests whose grammar broke off (their ids, and why): the caller fails them."""
        broken = []
        for rid in self.live:
            tokens = result.sampled_token_ids.get(rid)
            if not tokens or rid not in sched.num_scheduled_tokens:
                continue
            req = requests.get(rid)
            state = req.structured_output if req is not None else None
            if state is None:
                continue
            taken = 0
            for token in tokens:
                taken += 1
                if not state.accept_token(token):
                    if state.error is not None:
                        broken.append((rid, state.error))
                    break
                if state.is_terminated():
                    break
            if taken < len(tokens):  # the request ends within the step: the tokens after are not its
                result.sampled_token_ids[rid] = tokens[:taken]
        return broken

    def grammar_bitmask(self, sched: SchedulerOutput, requests: dict[str, Request]) -> GrammarBitmask | None:
        """Rows for the scheduled constrained requests that sample this step (their prompt and
        outputs all computed after it). Work in proportion to the constrained requests alone: a
        batch without any pays nothing."""
        if not self.live:
            return None
        ids: list[str] = []
        num_rows: list[int] = []
        row = 0
        for rid in list(self.live):
            req = requests.get(rid)
            if req is None:
                self.live.discard(rid)  # finished or aborted
                self.closing_ids.discard(rid)
                continue
            if rid not in sched.num_scheduled_tokens or req.num_computed_tokens < req.num_tokens:
                continue
            assert req.structured_output is not None
            if req.structured_output.thinking:
                continue  # its grammar applies once the model's thinking has ended
            drafts = sched.scheduled_spec_decode_tokens.get(rid, ())
            self._reserve(row + len(drafts) + 1)
            req.structured_output.fill_bitmask(self.bitmask, row, drafts)
            if not drafts:  # a request in its closing window is never drafted (trim_drafts)
                self._close_in_time(req, self.bitmask[row])
            ids.append(rid)
            num_rows.append(len(drafts) + 1)
            row += len(drafts) + 1
        if not ids:
            return None
        drafted = row > len(ids)
        return GrammarBitmask(ids, self.words, self.bitmask[:row].tobytes(), num_rows if drafted else [])

    def trim_drafts(self, requests: dict[str, Request]) -> None:
        """After the step's update: each constrained request's drafts for its next step cut to those
        its grammar accepts (vLLM validates them the same way), and none near a JSON request's closing
        window, where the mask narrows with the text so far."""
        for rid in self.live:
            req = requests.get(rid)
            if req is None or not req.spec_token_ids or req.structured_output is None:
                continue
            state = req.structured_output
            if not state.is_ready():
                req.spec_token_ids = []
                continue
            drafts = req.spec_token_ids
            if state.params.kind in CLOSING_KINDS and self._budget_left(req) <= CLOSING_WINDOW + len(drafts) + 1:
                req.spec_token_ids = []
                continue
            req.spec_token_ids = drafts[: state.valid_drafts(drafts)]

    def _reserve(self, rows: int) -> None:
        """The bitmask buffer holds at least `rows` rows (draft positions make a step's rows more
        than max_num_seqs)."""
        if rows > len(self.bitmask):
            grown = np.full((max(rows, 2 * len(self.bitmask)), self.words), -1, dtype=np.int32)
            grown[: len(self.bitmask)] = self.bitmask
            self.bitmask = grown

    @staticmethod
    def _budget_left(req: Request) -> int:
        return min(req.max_tokens - req.num_output_tokens, req.max_model_len - req.num_tokens)

    def _close_in_time(self, req: Request, row: np.ndarray) -> None:
        """JSON that would be cut off by max_tokens (or the context) closes instead (json_closing.py)."""
        assert req.structured_output is not None
        if req.structured_output.params.kind not in CLOSING_KINDS:
            return
        left = self._budget_left(req)
        if left <= CLOSING_WINDOW:
            text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
            closing = req.request_id in self.closing_ids
            if narrow_to_closing(row, text, left, self.closing, closing) and not closing:
                self.closing_ids.add(req.request_id)

    def shutdown(self) -> None:
        self.pool.shutdown()


def _as_compile_error(params: StructuredOutputsParams, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, any error from the grammar engine turned into a GrammarCompileError for `params`."""
    try:
        return fn(*args)
    except GrammarCompileError:
        raise
    except Exception as e:  # noqa: BLE001 - any engine error is this request's, never the loop's
        raise GrammarCompileError(
            params.source_field or "structured_outputs", f"could not compile the {params.kind} constraint: {e}"
        ) from e
