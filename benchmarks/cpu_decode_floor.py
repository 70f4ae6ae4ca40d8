"""The bytes one decode step must read, and Tram's decode step timed against them (cpu_roofline.py --decode-step).

A decode step at batch B reads every weight matrix once, except two kinds: of the embedding table
only the B rows it gathers, and of a mixture-of-experts layer only the experts its B tokens were
routed to. With k of E experts chosen per token and uniform routing, a layer's B tokens touch
E * (1 - (1 - k/E)^B) distinct experts on average; Tram's own router, hooked during a few steps,
gives the count it really chose. Each request's whole context is read from the KV cache as well.
The floor is those bytes at the best streaming read rate this CPU reaches.

Weight bytes come from the model's config at a float dtype, or from a GGUF file's own tensor sizes
(a Q4_K_M file mixes Q4_K, Q6_K and float32 tensors).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from tram.bench.datasets import random_requests
from tram.bench.timing import best_ms


@dataclass(frozen=True)
class MoELayout:
    num_experts: int
    top_k: int
    intermediate: int  # each expert's
    sparse_layers: tuple[int, ...]


def moe_layout(cfg: Any) -> MoELayout | None:
    """The experts of a Qwen3-MoE / Mixtral / gpt-oss config; None for a dense model. Qwen3-MoE keeps
    a dense MLP in `mlp_only_layers` and off its `decoder_sparse_step` period."""
    experts = int(getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0)
    if not experts:
        return None
    inter = int(getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size)
    top_k = int(getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "experts_per_token", None))
    step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(cfg, "mlp_only_layers", None) or ())
    sparse = tuple(i for i in range(cfg.num_hidden_layers) if i not in dense and (i + 1) % step == 0)
    return MoELayout(experts, top_k, inter, sparse)


def expected_distinct(num_experts: int, top_k: int, batch: int) -> float:
    """Distinct experts that `batch` tokens, each routed uniformly to `top_k` of them, touch on average."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


@dataclass
class WeightTable:
    """Bytes of a model's weights by how a decode step reads them."""

    whole: float  # attention, norms, routers, dense MLPs: read whole every step
    lm_head: float
    embedding_row: float  # one row of the input embedding table
    expert: dict[int, float]  # sparse layer -> bytes of one of its experts
    source: str


def _attention_macs(cfg: Any) -> int:
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.hidden_size * heads * head_dim + 2 * cfg.hidden_size * kv_heads * head_dim


def table_from_config(cfg: Any, elem: int) -> WeightTable:
    h, vocab = cfg.hidden_size, cfg.vocab_size
    moe = moe_layout(cfg)
    whole = h  # the final norm
    expert: dict[int, float] = {}
    for layer in range(cfg.num_hidden_layers):
        whole += _attention_macs(cfg) + 2 * h  # projections and the two norms
        if moe is not None and layer in moe.sparse_layers:
            whole += h * moe.num_experts  # the router
            expert[layer] = 3.0 * h * moe.intermediate * elem
        else:
            whole += 3 * h * cfg.intermediate_size
    # A tied LM head reads the embedding table: the same bytes either way.
    return WeightTable(
        float(whole * elem), float(vocab * h * elem), float(h * elem), expert, f"config, {elem} B/weight"
    )


def table_from_gguf(path: str, cfg: Any) -> WeightTable:
    """The file's own tensor sizes: `blk.N.ffn_*_exps` are the experts (E stacked), `token_embd` the
    embedding (gathered by rows), `output` the LM head (absent when tied to the embedding)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    moe = moe_layout(cfg)
    whole, lm_head, embed_row, expert = 0.0, 0.0, 0.0, {}
    for t in reader.tensors:
        nbytes = float(t.n_bytes)
        if "_exps." in t.name:
            layer = int(t.name.split(".")[1])
            expert[layer] = expert.get(layer, 0.0) + nbytes / moe.num_experts
        elif t.name == "token_embd.weight":
            embed_row, lm_head = nbytes / cfg.vocab_size, lm_head or nbytes
        elif t.name == "output.weight":
            lm_head = nbytes
        else:
            whole += nbytes
    return WeightTable(whole, lm_head, embed_row, expert, f"GGUF file {path}")


def step_weight_bytes(table: WeightTable, batch: int, distinct: dict[int, float]) -> dict[str, float]:
    """Weight bytes of one decode step at `batch`, with `distinct` experts read per sparse layer."""
    experts = sum(table.expert[layer] * distinct[layer] for layer in table.expert)
    return {
        "experts": experts,
        "whole": table.whole,
        "lm_head": table.lm_head,
        "embedding": table.embedding_row * batch,
    }


def uniform_distinct(cfg: Any, batch: int) -> dict[int, float]:
    moe = moe_layout(cfg)
    if moe is None:
        return {}
    return {layer: expected_distinct(moe.num_experts, moe.top_k, batch) for layer in moe.sparse_layers}


def stream_read_rate(repeats: int = 5) -> float:
    """GB/s of the fastest of three streaming reads of 1 GiB of float32 (far past any cache) on torch's
    threads: a sum, a max and a dot product (bfloat16 and int8 reductions are compute-bound in torch)."""
    data = torch.empty(2**28, dtype=torch.float32).uniform_(-1, 1)  # random, never zeros
    reads = (lambda: data.sum(), lambda: data.amax(), lambda: torch.dot(data, data))
    ms = min(best_ms(fn, repeats, 3) for fn in reads)
    return data.numel() * data.element_size() / (ms * 1e-3) / 1e9


# ---- Tram's decode step, measured ---------------------------------------------------------------
def make_llm(
    model: str, dtype: str, batch: int, max_model_len: int, seed: int, tokenizer: str | None, **extra: Any
) -> Any:
    from tram import LLM
    from tram.bench.presets import is_config_only

    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        seed=seed,
        max_num_seqs=batch,
        max_model_len=max_model_len,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
    )
    if is_config_only(model):
        kwargs["load_format"] = "dummy"
    if tokenizer:
        kwargs["tokenizer"] = tokenizer
    return LLM(model, **kwargs, **extra)


def _pure_decode(engine: Any, batch: int) -> bool:
    from tram.bench.latency import prompts_done

    return prompts_done(engine) and len(engine.engine_core.scheduler.running) == batch


def _router_hooks(model: torch.nn.Module, batch: int, counts: dict[int, list[int]]) -> list[Any]:
    """Hooks on every MoE router that record how many distinct experts its `batch` tokens chose."""
    from tram.model.layers.moe.block import SparseMoEBlock

    handles = []
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, SparseMoEBlock)]
    for name, block in blocks:
        layer = next(int(part) for part in name.split(".") if part.isdigit())
        top_k = block.spec.top_k

        def hook(_mod: Any, _inp: Any, logits: torch.Tensor, layer: int = layer, top_k: int = top_k) -> None:
            ids = torch.topk(logits[:batch].float(), top_k, dim=-1).indices  # softmax keeps the order
            counts.setdefault(layer, []).append(int(ids.unique().numel()))

        handles.append(block.gate.register_forward_hook(hook))
    return handles


def _module_timers(model: torch.nn.Module, totals: dict[str, float]) -> list[Any]:
    """Hooks that add each module's forward wall time (ms) to totals[its class name]; nested modules
    count in their own class and in every enclosing one."""
    starts: dict[int, float] = {}

    def pre(mod: Any, _inp: Any) -> None:
        starts[id(mod)] = time.perf_counter()

    def post(mod: Any, _inp: Any, _out: Any) -> None:
        name = type(mod).__name__
        totals[name] = totals.get(name, 0.0) + (time.perf_counter() - starts.pop(id(mod))) * 1e3

    handles = []
    for mod in model.modules():
        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


def measure_decode(
    llm: Any, batch: int, context: int, steps: int, warmup: int, route_steps: int, seed: int, modules: bool = False
) -> dict[str, Any]:
    """Median wall time of `steps` pure decode steps of `batch` requests with `context`-token prompts,
    the KV bytes each read, and the distinct experts the router chose in `route_steps` more steps;
    with `modules`, each module class's time per step in further `steps` steps (hooks slow them)."""
    from tram import SamplingParams

    engine = llm.llm_engine
    runner = engine.engine_core.model_runner
    profiled = steps if modules else 0
    params = SamplingParams(
        temperature=0.0, max_tokens=warmup + steps + route_steps + profiled + 2, ignore_eos=True, detokenize=False
    )
    ids = [f"decode-{i}" for i in range(batch)]
    for rid, req in zip(ids, random_requests(batch, (context, context), (1, 1), runner.vocab_size, seed)):
        engine.add_processed_request(rid, None, req.prompt_token_ids, params)
    kv_per_token = runner.bytes_per_block() // runner.block_size
    sched = engine.engine_core.scheduler
    times, kv, handles = [], [], []
    counts: dict[int, list[int]] = {}
    module_ms: dict[str, float] = {}
    try:
        for _ in range(batch * context + 100):
            if _pure_decode(engine, batch):
                break
            engine.step()
        for i in range(warmup + steps + route_steps + profiled):
            if not _pure_decode(engine, batch):
                raise RuntimeError(f"decode step {i} at batch {batch} is not a pure decode step")
            if i == warmup + steps:
                handles = _router_hooks(runner.model, batch, counts)
            if i == warmup + steps + route_steps and profiled:
                handles += _module_timers(runner.model, module_ms)
            context_tokens = sum(r.num_computed_tokens + 1 for r in sched.running)
            start = time.perf_counter()
            engine.step()
            if warmup <= i < warmup + steps:
                times.append((time.perf_counter() - start) * 1e3)
                kv.append(context_tokens * kv_per_token)
    finally:
        engine.abort_request(ids)
        for handle in handles:
            handle.remove()
    return {
        "step_ms": statistics.median(times),
        "step_ms_min": min(times),
        "step_ms_max": max(times),
        "kv_bytes": statistics.mean(kv),
        "distinct_measured": {layer: statistics.mean(c) for layer, c in sorted(counts.items())},
        "module_ms": {name: ms / max(profiled, 1) for name, ms in sorted(module_ms.items(), key=lambda kv: -kv[1])},
    }


# ---- the --decode-step report -----------------------------------------------------------------
def gguf_file(spec: str, model: str, seed: int) -> str:
    """A GGUF path as given, or a llama.cpp type's file in llama_cpp_peer.py's cache (converted from
    the preset's bfloat16 checkpoint)."""
    from pathlib import Path

    from llama_cpp_peer import CACHE

    if spec.endswith(".gguf"):
        return spec
    path = CACHE / "gguf" / f"{Path(resolve(model)).name}-bfloat16-seed{seed}-{spec}.gguf"
    if not path.exists():
        raise SystemExit(
            f"{path} is missing: make it with `python3 benchmarks/llama_cpp_peer.py convert --model {model} "
            f"--dtype bfloat16 --gguf-type {spec}`"
        )
    return str(path)


def resolve(model: str) -> str:
    from tram.bench.presets import resolve_model

    return resolve_model(model)


def floor_row(
    label: str, table: WeightTable, cfg: Any, args: Any, measured: dict[str, Any], rate: float
) -> dict[str, Any]:
    """Floors by uniform routing and by the experts Tram's router chose, and the step against them."""
    uniform = step_weight_bytes(table, args.batch, uniform_distinct(cfg, args.batch))
    row: dict[str, Any] = {"target": label, "weights": table.source, **measured, "uniform_bytes": uniform}
    for name, weights in (("uniform", uniform), ("routed", None)):
        if name == "routed":
            if not measured["distinct_measured"]:
                continue
            weights = step_weight_bytes(table, args.batch, measured["distinct_measured"])
            row["routed_bytes"] = weights
        total = sum(weights.values()) + measured["kv_bytes"]
        row[f"floor_ms_{name}"] = total / (rate * 1e9) * 1e3
        row[f"ratio_{name}"] = measured["step_ms"] / row[f"floor_ms_{name}"]
    return row


def print_row(row: dict[str, Any], goal: float) -> None:
    u = row["uniform_bytes"]
    print(f"\n{row['target']} ({row['weights']})")
    print(
        f"  bytes/step by uniform routing: experts {u['experts'] / 1e9:.3f} GB, other weights "
        f"{u['whole'] / 1e9:.3f} GB, LM head {u['lm_head'] / 1e9:.3f} GB, embedding rows "
        f"{u['embedding'] / 1e6:.2f} MB, KV {row['kv_bytes'] / 1e9:.4f} GB"
    )
    if row["distinct_measured"]:
        counts = ", ".join(f"{v:.1f}" for v in row["distinct_measured"].values())
        print(f"  distinct experts per layer chosen by Tram's router: {counts}")
    print(f"  step {row['step_ms']:.1f} ms (median; min {row['step_ms_min']:.1f}, max {row['step_ms_max']:.1f})")
    if row.get("module_ms"):
        print("  ms per step by module class (forward hooks; nested classes count in each):")
        for name, ms in row["module_ms"].items():
            print(f"    {name:28s} {ms:8.2f}")
    for name in ("uniform", "routed"):
        if f"ratio_{name}" in row:
            ratio = row[f"ratio_{name}"]
            verdict = "meets" if ratio <= goal else "misses"
            print(
                f"  floor ({name} routing) {row[f'floor_ms_{name}']:.1f} ms: step = {ratio:.2f}x the floor "
                f"({verdict} the goal of {goal}x)"
            )


def run_decode_step(args: Any) -> None:
    import gc

    from transformers import AutoConfig

    from tram.bench.report import machine_info, machine_summary, write_json
    from tram.executor.cpu_threads import environment

    model = resolve(args.model)
    cfg = AutoConfig.from_pretrained(model)
    elem = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    targets = [] if args.gguf_only else [(f"{args.model} {args.dtype}", model, table_from_config(cfg, elem), None)]
    if args.gguf and not args.float_only:
        path = gguf_file(args.gguf, args.model, args.seed)
        acts = "int8" if args.gguf_activations == "int8" else args.dtype
        targets.append((f"{args.model} GGUF {args.gguf} ({acts} activations)", path, None, model))
    print(machine_summary())
    rate = stream_read_rate()
    print(f"best streaming read: {rate:.1f} GB/s on {torch.get_num_threads()} threads")
    print(f"batch {args.batch}, prompts of {args.context} tokens, {args.steps} timed decode steps")
    rows = []
    for label, path, table, tokenizer in targets:
        table = table or table_from_gguf(path, cfg)
        with environment({"TRAM_CPU_THREADS": str(args.threads)}):
            extra = {"gguf_activations": args.gguf_activations} if path.endswith(".gguf") else {}
            max_len = args.context + 2 * args.steps + 16
            llm = make_llm(path, args.dtype, args.batch, max_len, args.seed, tokenizer, **extra)
        with torch.inference_mode():
            measured = measure_decode(llm, args.batch, args.context, args.steps, 2, 2, args.seed, args.modules)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        rows.append(floor_row(label, table, cfg, args, measured, rate))
        print_row(rows[-1], args.goal)
    if args.output_json:
        write_json(args.output_json, {"machine": machine_info(), "args": vars(args), "read_GBps": rate, "rows": rows})
