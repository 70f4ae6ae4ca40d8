"""Shared fixtures: the real stories260K model, the transformers oracle, and the leak check that
runs after every engine workload."""

from __future__ import annotations

import os
import sys

# Triton kernels run under Triton's interpreter in the tests (CPU tensors, tiny shapes). Triton reads
# the variable when it is first imported, and torch imports it early (torch._dynamo), so it is set
# here, before anything else. On a GPU machine, TRITON_INTERPRET=0 tests the compiled kernels.
os.environ.setdefault("TRITON_INTERPRET", "1")

from functools import lru_cache  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from api_helpers import PROMPT, assert_no_leak, greedy_ids  # noqa: E402,F401 (assert_no_leak: re-exported)

from tram import LLM, SamplingParams  # noqa: E402

if TYPE_CHECKING:
    from server_pool import ServerSpec

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

STORIES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "stories260K"))
STORIES_EOS = [2, 1]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The order in which modules will start their servers (server_pool.py starts each one ahead);
    the first of them, and the shared `stories_server` if a test uses it, start at once."""
    modules = [m for m in dict.fromkeys(getattr(item, "module", None) for item in session.items) if m is not None]
    shared = any("stories_server" in getattr(item, "fixturenames", ()) for item in session.items)
    if shared or any(getattr(m, "SERVERS", None) for m in modules):
        from server_pool import POOL, plan_from  # httpx, openai: only where a server runs

        POOL.plan = plan_from(modules)
        POOL.start_early(stories_server_spec() if shared else None)


def stories_server_spec() -> ServerSpec:
    """`stories_server`'s: stories260K with no flags, one engine thread (server_utils.DEFAULT_SERVER_ENV)."""
    from server_pool import ServerSpec
    from server_utils import DEFAULT_SERVER_ENV

    return ServerSpec(STORIES, (), tuple(DEFAULT_SERVER_ENV.items()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    pool = sys.modules.get("server_pool")  # imported only where a module starts a server
    if pool is not None:
        pool.POOL.close()


@pytest.fixture(autouse=True)
def _default_device_back_on_the_host():
    """The Triton tests make CUDA torch's default device when they run compiled on a GPU
    (tests/triton_interp.py); every other test makes its tensors on the CPU."""
    yield
    if torch.cuda.is_available():
        torch.set_default_device(None)


@pytest.fixture(params=[1, 2], ids=lambda n: f"threads{n}")
def threads(request: pytest.FixtureRequest):
    """Runs a kernel test with one and with two torch threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def stories_path() -> str:
    assert os.path.isdir(STORIES), f"test model missing: {STORIES}"
    return STORIES


@pytest.fixture(scope="session")
def stories_server(stories_path: str):
    """One `tram serve` of stories260K with no flags, shared by every module that needs no others
    (each takes it through server_utils.shared_server). A server start costs seconds, so the session
    starts this one once (as it begins: see pytest_collection_finish); at the session's end it must
    be idle and exit cleanly."""
    from server_pool import pool_server

    yield from pool_server(stories_server_spec(), prefetch=False)


@pytest.fixture(scope="session")
def stories_llm(stories_path: str) -> LLM:
    return LLM(stories_path, max_num_seqs=64)


@pytest.fixture
def llm(stories_llm: LLM):
    """The shared stories260K LLM; its block pool is checked for leaks after each test."""
    yield stories_llm
    assert_no_leak(stories_llm.llm_engine)


@lru_cache(maxsize=8)
def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def hf_greedy(path: str, prompt_ids: list[int], max_new_tokens: int, eos: list[int] | None) -> list[int]:
    """transformers' greedy continuation: the oracle, including the stop token if one ended it."""
    model = hf_model(path)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        )
    return out[0, len(prompt_ids) :].tolist()


def hf_logprobs(path: str, token_ids: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at every position: [len, vocab]."""
    model = hf_model(path)
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


# ---- the shared stories260K engine, as the engine API tests use it


@pytest.fixture(scope="module")
def ref(stories_llm: LLM) -> dict:
    """Greedy references on the shared LLM (computed once)."""
    llm = stories_llm
    tok = llm.get_tokenizer()
    long = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=400), use_tqdm=False)[0]
    story = long.outputs[0]
    assert story.finish_reason == "stop" and story.token_ids[-1] == 1, "the reference story must end on BOS"
    return {
        "once": greedy_ids(llm, PROMPT, 40),
        "tom": greedy_ids(llm, "Tom and his dog", 40),
        # A prompt after which greedy decoding immediately ends the story with BOS (id 1).
        "story_end": long.prompt_token_ids + story.token_ids[:-1],
        "tok": tok,
    }


@pytest.fixture
def no_request_left_behind(stories_llm: LLM):
    """(Used by the engine API tests.) A test that leaves requests unfinished fails here, and they are
    aborted so that later tests (whose LLM.generate would otherwise wait on them forever) still run."""
    yield
    engine = stories_llm.llm_engine
    left = list(engine.output_processor.requests)
    left_core = list(engine.engine_core.scheduler.requests)
    engine.abort_request(left)
    engine.engine_core.abort_requests(left_core)
    engine.output_processor.sample_owner.clear()
    assert not left and not left_core, f"requests left unfinished: {left} (core: {left_core})"


@pytest.fixture(scope="module")
def small_llm(stories_path: str) -> LLM:
    """No prefix caching, two sequences at a time, and the smallest cache that fits one context
    (32 blocks of 16 = 512 tokens), so that two long requests must preempt each other."""
    return LLM(stories_path, max_num_seqs=2, enable_prefix_caching=False, num_gpu_blocks_override=32)


@pytest.fixture
def small(small_llm: LLM):
    yield small_llm
    assert_no_leak(small_llm.llm_engine)
