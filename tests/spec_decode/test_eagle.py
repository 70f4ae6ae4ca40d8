"""The EAGLE proposers with random-weight heads in the published layouts (tram/bench/eagle_heads.py; no
trained head can be downloaded here): they load, leave every request's output as plain decoding's
under chunked prefill, prefix caching, preemption and the context's end, and draft what a dense
implementation of the head (written here from the papers, over transformers' hidden states of the
target) drafts from the same tokens: the paged, incremental first pass, its shifted tokens and its
K/V rolled back with the target's are right."""

from __future__ import annotations

import json
import math

import pytest
import torch
from api_helpers import assert_no_leak
from conftest import STORIES, hf_model
from safetensors.torch import load_file

from tram import LLM, SamplingParams
from tram.bench.eagle_heads import write_random_eagle_head
from tram.config import EngineArgs
from tram.engine.engine_config import create_engine_config
from tram.worker.spec_step import Drafter

MAX_LEN = 128
K = 3


@pytest.fixture(scope="module", params=["eagle", "eagle3"])
def head(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    method = request.param
    return method, str(write_random_eagle_head(STORIES, method, tmp_path_factory.mktemp(method), seed=3))


def _llm(method: str, path: str, **kwargs) -> LLM:
    spec = {"method": method, "model": path, "num_speculative_tokens": K}
    return LLM(STORIES, max_model_len=MAX_LEN, speculative_config=spec, **kwargs)


def test_output_is_plain_decodings_under_the_scheduler_features(head, llm, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
    method, path = head
    small = _llm(method, path, max_num_seqs=3, num_gpu_blocks_override=14, max_num_batched_tokens=24)
    try:
        tok = llm.get_tokenizer()
        story = tok.encode("Once upon a time, there was a little girl named Lily. She liked to play outside.")
        prompts = [story, story, story[:20] * 3, tok.encode("Tom and his dog")]
        params = SamplingParams(temperature=0, max_tokens=MAX_LEN, ignore_eos=True)
        got = small.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        want = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [
            o.outputs[0].token_ids[: MAX_LEN - len(p)] for o, p in zip(want, prompts)
        ]
        stats = small.llm_engine.get_stats()
        assert stats.num_preemptions > 0 and any(o.num_cached_tokens > 0 for o in got)
        assert stats.spec_decoding.num_draft_tokens > 0
        assert_no_leak(small.llm_engine)
    finally:
        small.llm_engine.engine_core.shutdown()


# ---- the dense reference


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:  # [T, H, D], positions 0..T-1
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.arange(x.shape[0], dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def _layer(w: dict, p: str, x: torch.Tensor, residual: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Causal attention over x (the layer's normed input) added to residual, then the gated MLP."""
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    t = x.shape[0]
    q = _rope((x @ w[f"{p}.self_attn.q_proj.weight"].T).view(t, heads, d), cfg["rope_theta"])
    k = _rope((x @ w[f"{p}.self_attn.k_proj.weight"].T).view(t, kv, d), cfg["rope_theta"])
    v = (x @ w[f"{p}.self_attn.v_proj.weight"].T).view(t, kv, d)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, heads * d)
    h = residual + attn @ w[f"{p}.self_attn.o_proj.weight"].T
    m = _rms(h, w[f"{p}.post_attention_layernorm.weight"], cfg["rms_norm_eps"])
    gate, up = m @ w[f"{p}.mlp.gate_proj.weight"].T, m @ w[f"{p}.mlp.up_proj.weight"].T
    return h + (torch.nn.functional.silu(gate) * up) @ w[f"{p}.mlp.down_proj.weight"].T


def _dense_drafts(method: str, path: str, tokens: list[int], k: int) -> list[int]:
    """k greedy drafts after `tokens` (the last one just sampled), each pass over the whole sequence."""
    w = load_file(f"{path}/model.safetensors")
    cfg = json.loads(open(f"{path}/config.json").read())
    target = hf_model(STORIES)
    with torch.no_grad():
        out = target(torch.tensor([tokens]), output_hidden_states=True)
        hs = [h[0] for h in out.hidden_states]
        embed = target.get_input_embeddings().weight
        lm_head = target.get_output_embeddings().weight
        n = len(tokens)
        if method == "eagle":
            feature = hs[-1][: n - 1]  # the target's final normed hidden state of positions 0..n-2
        else:
            layers = len(hs) - 1
            aux = torch.cat([hs[i] for i in (2, layers // 2, layers - 3)], -1)
            feature = aux[: n - 1] @ w["fc.weight"].T
        inputs = list(tokens[1:])  # position p reads token p+1
        drafts: list[int] = []
        for _ in range(k):
            e = embed[torch.tensor(inputs)]
            if method == "eagle":
                x = torch.cat([e, feature], -1) @ w["fc.weight"].T + w["fc.bias"]
                h = _layer(w, "layers.0", x, x, cfg)
                logits, nxt = h[-1] @ lm_head.T, h[-1]
            else:
                eps = cfg["rms_norm_eps"]
                x = torch.cat(
                    [
                        _rms(e, w["midlayer.input_layernorm.weight"], eps),
                        _rms(feature, w["midlayer.hidden_norm.weight"], eps),
                    ],
                    -1,
                )
                h = _layer(w, "midlayer", x, feature, cfg)
                draft = (_rms(h[-1], w["norm.weight"], eps) @ w["lm_head.weight"].T).argmax()
                logits, nxt = None, h[-1]
            token = int(logits.argmax()) if logits is not None else int(draft + w["d2t"][draft])
            drafts.append(token)
            inputs.append(token)
            feature = torch.cat([feature, nxt[None]])
    return drafts


def test_drafts_are_a_dense_implementations(head, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
    method, path = head
    seen: list[tuple[list[int], list[int]]] = []
    original = Drafter.propose

    def recording(self, batch, rows, processors):
        out = original(self, batch, rows, processors)
        for row in rows:
            state = batch.states[row]
            if state.req_id in out:
                seen.append((batch.token_ids[row, : batch.num_tokens[row]].tolist(), out[state.req_id]))
        return out

    monkeypatch.setattr(Drafter, "propose", recording)
    # Chunked prompts (16 tokens a step), two requests at once, the second hitting the first's blocks.
    small = _llm(method, path, max_num_seqs=2, max_num_batched_tokens=16)
    try:
        tok = small.get_tokenizer()
        story = tok.encode("Once upon a time, there was a little girl named Lily. She liked to")
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        small.generate([{"prompt_token_ids": story}, {"prompt_token_ids": story + story[:7]}], params, use_tqdm=False)
    finally:
        small.llm_engine.engine_core.shutdown()
    assert len(seen) > 20
    for tokens, drafts in seen[:: len(seen) // 8]:
        assert drafts == _dense_drafts(method, path, tokens, len(drafts)), f"after {len(tokens)} tokens"


def test_a_head_for_another_width_is_refused(tmp_path):
    path = write_random_eagle_head(STORIES, "eagle", tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    with pytest.raises(ValueError, match=r"eagle head's hidden_size \(128\) is not the target's \(64\)"):
        create_engine_config(
            EngineArgs(
                model=STORIES, speculative_config={"method": "eagle", "model": str(path), "num_speculative_tokens": 2}
            )
        )


def test_a_request_the_head_sat_out_is_not_drafted_again(head, llm, monkeypatch: pytest.MonkeyPatch):
    """From two requests on nothing is drafted and the head does not run (disable_by_batch_size);
    it cannot recompute what it missed without the target's features, so those requests finish
    undrafted, and unchanged; a request that arrives to a batch of one is drafted from its start."""
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
    method, path = head
    spec = {"method": method, "model": path, "num_speculative_tokens": K, "disable_by_batch_size": 2}
    small = LLM(STORIES, max_model_len=MAX_LEN, speculative_config=spec)
    try:
        tok = llm.get_tokenizer()
        prompts = [tok.encode("Once upon a time, Lily"), tok.encode("Tom and his dog")]
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (10, 40)]
        got = small.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        want = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
        assert (
            small.llm_engine.get_stats().spec_decoding is None
            or small.llm_engine.get_stats().spec_decoding.num_drafts == 0
        )
        alone = small.generate({"prompt_token_ids": prompts[1]}, params[1], use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == want[1].outputs[0].token_ids
        assert small.llm_engine.get_stats().spec_decoding.num_drafts > 0
        assert_no_leak(small.llm_engine)
    finally:
        small.llm_engine.engine_core.shutdown()
