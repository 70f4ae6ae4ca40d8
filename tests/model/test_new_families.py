"""The families beyond Llama through the whole engine (tram.LLM) against transformers on the same
random weights: Qwen3, Gemma 3, Phi-3 (fused qkv/gate_up; Phi-4-mini's LongRoPE and partial rotary),
OLMo 2 (post-norms, q/k norms over all heads), Granite 3 (multipliers), SmolLM3 (NoPE layers) and
the mixtures of experts Qwen3-MoE, Mixtral and gpt-oss (attention sinks, YaRN, sliding layers).

Greedy tokens must be transformers' own, token for token, and sampled-token logprobs within float
tolerance; also under chunked prefill, with prefix-cache hits, with preemption (a KV cache too small
for the batch), with staggered arrivals and under tensor parallelism 2. Gemma 3's sliding window (5)
is far shorter than the prompts plus generations, so its sliding and global layers both matter.

Cost: each family's engines are built once (the module-scoped `family` fixture, which pytest runs
family by family) and shared by its tests. transformers checks a continuation with one forward
over prompt + output, memoised: greedy decoding is right when the argmax at every position is the
next token, which is what transformers' generate would pick (run once, where LongRoPE switches).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cached_property, lru_cache

import pytest
import torch
from api_helpers import assert_no_leak, run_staggered
from conftest import hf_greedy, hf_logprobs
from hf_models import _BASE, KINDS, make_hf_model_dir

from tram import LLM, SamplingParams

# Each family through every test; Phi-3 as Phi-4-mini (fused weights, LongRoPE, partial rotary).
FAMILIES = ["qwen3", "gemma3", "phi4_mini", "olmo2", "granite", "smollm3", "qwen3_moe", "mixtral", "gpt_oss"]
# Other settings of a family above, through the greedy and logprobs test only.
VARIANTS = ["phi3", "gemma3_softcap"]
# One engine of two ranks each (worker processes).
TP_KINDS = ["phi4_mini", "olmo2", "granite", "smollm3", "qwen3", "gemma3", "mistral", "qwen3_moe", "gpt_oss"]
MAX_TOKENS = 20
NO_EOS = [512]  # an id outside the 512-token vocabulary: transformers then stops on length only, like ignore_eos
MAX_LEN = 128
SMALL_LEN = 64  # the small engine's context: the longest prompt (39 tokens) and its output fit
# Blocks of 4 tokens in the small engine: one request fits, a batch of them does not. Gemma 3's
# and gpt-oss's sliding layers hold blocks of their own (a hybrid KV cache), beside those of their global layers.
SMALL_BLOCKS = {"gemma3": 40, "gpt_oss": 40}


def _prompts(seed: str, count: int = 4, shortest: int = 6) -> list[list[int]]:
    """count random prompts of shortest to 39 tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(shortest, 40))] for _ in range(count)]


def _greedy(max_tokens: int = MAX_TOKENS, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)


def _token_ids(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@lru_cache(maxsize=128)
def _reference(path: str, token_ids: tuple[int, ...]) -> torch.Tensor:
    """transformers' log-probabilities [len, vocab] at every position of token_ids (one forward)."""
    return hf_logprobs(path, list(token_ids))


def assert_transformers_greedy(path: str, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """tokens are transformers' greedy continuation of prompt: each is the argmax after the ones
    before it. Returns transformers' log-probabilities over prompt + tokens."""
    ref = _reference(path, tuple(prompt + tokens))
    expected = ref[len(prompt) - 1 : -1].argmax(dim=-1).tolist()
    first_diff = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    assert first_diff is None, f"{path}: prompt {prompt}: token {first_diff} is {tokens[first_diff]}, not {expected}"
    return ref


def assert_all_greedy(path: str, prompts: list[list[int]], outputs: list[list[int]]) -> None:
    assert len(outputs) == len(prompts)
    for prompt, tokens in zip(prompts, outputs):
        assert len(tokens) > 0
        assert_transformers_greedy(path, prompt, tokens)


class Family:
    """One family's model folder and its engines, built on first use and shared by its tests."""

    def __init__(self, kind: str, path: str) -> None:
        self.kind = kind
        self.path = path

    @cached_property
    def plain(self) -> LLM:
        """Room for every prompt in one step; blocks of 8 for the prefix-cache test."""
        return LLM(self.path, max_num_seqs=8, max_model_len=MAX_LEN, block_size=8)

    @cached_property
    def small(self) -> LLM:
        """A 16-token budget (longer prompts prefill in chunks beside decodes) and fewer blocks than
        a batch of requests needs, so that some are preempted and recomputed."""
        return LLM(
            self.path,
            max_num_seqs=8,
            max_model_len=SMALL_LEN,
            max_num_batched_tokens=16,
            block_size=4,
            num_gpu_blocks_override=SMALL_BLOCKS.get(self.kind, 20),
        )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """kind -> its random model folder, written on first use."""
    tmp = tmp_path_factory.mktemp("new_families")
    made: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = make_hf_model_dir(tmp, kind)
        return made[kind]

    return get


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, model_dir: Callable[[str], str]) -> Family:
    return Family(request.param, model_dir(request.param))


def _check_greedy_and_logprobs(kind: str, path: str, llm: LLM) -> None:
    prompts = _prompts(kind)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], _greedy(logprobs=2), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        comp = out.outputs[0]
        ref = assert_transformers_greedy(path, prompt, comp.token_ids)  # [len, vocab]
        for i, tok in enumerate(comp.token_ids):
            row = ref[len(prompt) - 1 + i]
            scale = max(1.0, row.abs().max().item())
            assert comp.logprobs[i][tok].logprob == pytest.approx(row[tok].item(), abs=2e-4 * scale)
    assert_no_leak(llm.llm_engine)


def test_greedy_and_logprobs_match_transformers(family: Family) -> None:
    _check_greedy_and_logprobs(family.kind, family.path, family.plain)


@pytest.mark.parametrize("kind", VARIANTS)
def test_variant_greedy_and_logprobs_match_transformers(kind: str, model_dir: Callable[[str], str]) -> None:
    """Phi-3 with the default RoPE over whole heads and an untied LM head; Gemma 3 with soft-capped logits."""
    path = model_dir(kind)
    _check_greedy_and_logprobs(kind, path, LLM(path, max_num_seqs=8, max_model_len=MAX_LEN))


def test_prefix_cache_hits_keep_greedy_output(family: Family) -> None:
    """Prompts sharing a 30-token prefix: later ones reuse its three full 8-token blocks."""
    llm = family.plain
    rng = random.Random(family.kind + "-prefix")
    prefix = [rng.randrange(3, 512) for _ in range(30)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(n)] for n in (3, 9, 1)]
    params = _greedy(max_tokens=8)  # a wrong cached block shows in the first tokens
    first = llm.generate({"prompt_token_ids": prompts[0]}, params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    later = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    assert [o.num_cached_tokens for o in later] == [24, 24]
    assert_all_greedy(family.path, prompts, [o.outputs[0].token_ids for o in [first, *later]])
    assert_no_leak(llm.llm_engine)


def test_chunked_prefill_keeps_greedy_output(family: Family) -> None:
    """A budget of 16 tokens a step: the prompts are prefilled in chunks, beside the other's decodes."""
    llm = family.small
    prompts = _prompts(family.kind + "-chunked", count=2, shortest=20)
    assert_all_greedy(family.path, prompts, _token_ids(llm, prompts, _greedy(max_tokens=12)))
    assert_no_leak(llm.llm_engine)


def test_preemption_keeps_greedy_output(family: Family) -> None:
    """Five requests of up to 55 tokens in a few blocks of 4: some are preempted and recomputed."""
    llm = family.small
    before = llm.llm_engine.get_stats().num_preemptions
    prompts = _prompts(family.kind + "-preempt", count=5)
    assert_all_greedy(family.path, prompts, _token_ids(llm, prompts, _greedy(max_tokens=16)))
    assert llm.llm_engine.get_stats().num_preemptions > before
    assert_no_leak(llm.llm_engine)


def test_staggered_arrivals_keep_greedy_output(family: Family) -> None:
    """Requests joining a running batch every 3 steps, under a small budget, get transformers' tokens."""
    llm = family.small
    prompts = _prompts(family.kind + "-stagger", count=4)
    params = [_greedy(max_tokens=8 + 2 * i) for i in range(len(prompts))]
    assert_all_greedy(family.path, prompts, run_staggered(llm.llm_engine, prompts, params, every=3))
    assert_no_leak(llm.llm_engine)


def test_longrope_long_factors_match_transformers(model_dir: Callable[[str], str]) -> None:
    """A context longer than original_max_position_embeddings (512) rotates with the long factors at
    every position; transformers does the same for a sequence longer than 512 from its first step."""
    path = model_dir("phi4_mini")
    llm = LLM(path, max_num_seqs=4, max_model_len=640)
    rng = random.Random("phi4-long")
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (530, 560)]
    outs = _token_ids(llm, prompts, _greedy(max_tokens=8))
    assert_all_greedy(path, prompts, outs)
    assert outs[0] == hf_greedy(path, prompts[0], 8, NO_EOS)
    assert_no_leak(llm.llm_engine)


@pytest.mark.parametrize("kind", TP_KINDS)
def test_tensor_parallel_greedy_matches_transformers(kind: str, model_dir: Callable[[str], str]) -> None:
    """Two ranks, each with half the heads (OLMo 2's q/k norms then sum their squares across ranks),
    half the MLP channels and half the vocabulary; a 16-token budget chunks the longer prompts."""
    path = model_dir(kind)
    prompts = _prompts(kind + "-tp", count=3)
    llm = LLM(path, tensor_parallel_size=2, max_num_seqs=8, max_num_batched_tokens=16, max_model_len=MAX_LEN)
    try:
        assert_all_greedy(path, prompts, _token_ids(llm, prompts, _greedy(max_tokens=12)))
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("num_heads,ranks", [(4, 4), (2, 4)])  # (2, 4): each head on two ranks
def test_sharded_row_norm_matches_the_whole_row(num_heads: int, ranks: int, monkeypatch) -> None:
    """OLMo 2's q/k norm with each of `ranks` ranks holding its heads' slice of the row: the all-reduced
    sum of squares (here the ranks' sums added up front) gives each the whole row's norm."""
    import tram.model.layers.norm as norm_module
    from tram.model.layers.norm import ShardedRowRMSNorm
    from tram.model.weight_utils import get_weight_loader

    head_dim, eps = 8, 1e-5
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(5, num_heads * head_dim, generator=gen)  # [T, H * D]
    weight = 1 + 0.2 * torch.randn(num_heads * head_dim, generator=gen)
    whole = weight * (row * torch.rsqrt(row.pow(2).mean(-1, keepdim=True) + eps))
    heads_per_rank = max(1, num_heads // ranks)
    replicas = ranks * heads_per_rank // num_heads
    firsts = [rank * num_heads // ranks for rank in range(ranks)]  # each rank's first head
    slices = [slice(h * head_dim, (h + heads_per_rank) * head_dim) for h in firsts]
    total = sum(row[:, s].pow(2).sum(-1, keepdim=True) for s in slices)  # what all-reduce returns
    monkeypatch.setattr(norm_module, "tp_all_reduce", lambda x: total)
    for s in slices:
        norm = ShardedRowRMSNorm(num_heads * head_dim, s.start, s.stop - s.start, eps, torch.float32, replicas)
        with torch.no_grad():
            get_weight_loader(norm.weight)(norm.weight, weight)
        torch.testing.assert_close(norm(row[:, s]), whole[:, s], rtol=1e-6, atol=1e-6)


def test_fused_checkpoint_tensors_split_into_the_linears() -> None:
    """Phi-3's qkv_proj rows go to q, k, v (then gate_up_proj's to gate, up); a wrong row count is refused."""
    import transformers

    from tram.model.models.phi3 import Phi3ForCausalLM
    from tram.model.weight_utils import WeightShapeError, fused_parts, split_fused

    config = transformers.Phi3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
    )
    with torch.device("meta"):
        model = Phi3ForCausalLM(config, torch.float32, "torch")
    prefix = "model.layers.0."
    parts = fused_parts(model, prefix + "self_attn.qkv_proj.weight")
    assert parts == [(prefix + f"self_attn.{p}_proj.weight", n) for p, n in (("q", 64), ("k", 32), ("v", 32))]
    assert [n for _, n in fused_parts(model, prefix + "mlp.gate_up_proj.weight")] == [96, 96]
    assert fused_parts(model, prefix + "self_attn.o_proj.weight") == []
    fused = torch.arange(128.0).unsqueeze(1).expand(128, 64)
    assert [piece[0, 0].item() for _, piece in split_fused(fused, parts)] == [0.0, 64.0, 96.0]
    with pytest.raises(WeightShapeError):
        split_fused(fused[:120], parts)


def test_longrope_factors_as_transformers_computes_them() -> None:
    """Short factors for a context up to original_max_position_embeddings, long ones beyond; the
    same inverse frequencies and attention factor as transformers' own LongRoPE function."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tram.model.layers.rope import _inv_freq_and_scaling

    config = transformers.Phi3Config(**{**_BASE, **KINDS["phi4_mini"][1]})
    head_dim = config.hidden_size // config.num_attention_heads
    for max_model_len, seq_len in ((512, None), (513, 513)):
        ours, scaling = _inv_freq_and_scaling(config, head_dim, None, max_model_len)
        theirs, their_scaling = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq_len)
        assert torch.equal(ours, theirs) and scaling == their_scaling


def test_smollm3_nope_layers_from_the_list_or_the_interval() -> None:
    from types import SimpleNamespace

    from tram.model.models.smollm3 import smollm3_rope_layers

    assert smollm3_rope_layers(SimpleNamespace(num_hidden_layers=8)) == [True, True, True, False] * 2
    interval = SimpleNamespace(num_hidden_layers=4, no_rope_layer_interval=2, no_rope_layers=None)
    assert smollm3_rope_layers(interval) == [True, False, True, False]
    assert smollm3_rope_layers(SimpleNamespace(num_hidden_layers=2, no_rope_layers=[0, 1])) == [False, True]
