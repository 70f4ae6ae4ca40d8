"""A mixture-of-experts MLP: the router, then the experts the router chose, fused over the batch.

    h = x @ w13[e].T (+ b13[e]) = [gate | up];  y = act(gate, up) @ w2[e].T (+ b2[e]);
    out[t] = sum_j weight[t, j] * y(t, expert[t, j])

Experts are stacked ([E, 2I, H] and [E, H, I], experts.py) so that one kernel call runs all of a
step's tokens through all of their experts: the CPU's C++ kernel (cpu_kernel.py), Triton's on a GPU
(triton_moe.py), the grouped PyTorch path (reference.py) where neither takes the weights' form.

Parallelism over the tensor-parallel group, as vLLM's FusedMoE:
  * tensor parallel (default): every rank holds every expert's slice [start, start + I / tp) of
    the intermediate channels (w13's gate and up rows, w2's columns);
  * expert parallel (`enable_expert_parallel`): rank r holds whole experts [r * E / tp, (r + 1) * E / tp).
Either way each rank's output is a partial sum, and one all-reduce adds them (b2 is added on the
rank that owns the expert's whole output: rank 0 under TP, the expert's rank under EP).

Checkpoint tensors come one expert and projection at a time (Qwen3-MoE's `experts.3.gate_proj.weight`,
Mixtral's `experts.3.w1.weight`, named by `expert_names`) or stacked (gpt-oss; its family file loads
those); `load_checkpoint_tensor` takes each, and `loaded_params` says which stacked parameters are complete.
"""

from __future__ import annotations

import torch
from torch import nn

from tram.distributed import expert_parallel, get_tp, shard_range, tp_all_reduce
from tram.model.layers.moe.checkpoint_experts import ExpertSlot, as_expert, stacked_experts
from tram.model.layers.moe.cpu_kernel import (
    FusedMoECall,
    bind_fused_moe,
    takes_every_token_count,
    takes_int8_activations,
)
from tram.model.layers.moe.experts import ExpertWeights, quantize_experts
from tram.model.layers.moe.reference import grouped_moe
from tram.model.layers.moe.spec import MoESpec
from tram.model.layers.parallel_linear import Shard
from tram.model.weight_utils import WeightShapeError

# The C++ kernel's crossover with the grouped path, in (token, slot) pairs per local expert on
# average: on Qwen3-30B-A3B's layer shape (docs/benchmarks.md, "Mixture of experts") the kernel is
# 1.6x faster at 4 and 2x slower at 32.
FUSED_MAX_SLOTS_PER_EXPERT = 8
# Per-expert checkpoint tensor name -> (parameter, half of w13: 0 gate, 1 up; None for w2).
QWEN_EXPERT_NAMES = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None)}
MIXTRAL_EXPERT_NAMES = {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", None)}


class FusedMoE(nn.Module):
    """The experts of one layer (the router is the family block's): forward(x [T, hidden],
    topk_weights [T, k] float32, topk_ids [T, k] int32 global expert ids) -> [T, hidden]."""

    # The Triton kernel on any device: set on CPU by tests, which run it under Triton's interpreter.
    use_triton = False

    def __init__(
        self,
        spec: MoESpec,
        hidden_size: int,
        dtype: torch.dtype,
        expert_names: dict[str, tuple[str, int | None]] | None = None,
    ) -> None:
        super().__init__()
        tp = get_tp()
        self.spec = spec
        self.hidden_size = hidden_size
        self.tp_size, self.tp_rank = tp.size, tp.rank
        self.expert_names = expert_names or QWEN_EXPERT_NAMES
        self.ep = expert_parallel() and tp.size > 1
        experts, width = spec.num_experts, spec.intermediate_size
        if self.ep:
            if experts % tp.size:
                raise ValueError(f"expert-parallel size {tp.size} does not divide the model's {experts} experts")
            self.first_expert, self.num_local = shard_range(experts, tp.rank, tp.size)
            self.channel_start, self.width = 0, width
        else:
            self.first_expert, self.num_local = 0, experts
            self.channel_start, self.width = shard_range(width, tp.rank, tp.size)
        self.w13_weight = nn.Parameter(torch.empty(self.num_local, 2 * self.width, hidden_size, dtype=dtype))
        self.w2_weight = nn.Parameter(torch.empty(self.num_local, hidden_size, self.width, dtype=dtype))
        self.w13_bias = self.w2_bias = None
        if spec.bias:
            self.w13_bias = nn.Parameter(torch.empty(self.num_local, 2 * self.width, dtype=dtype))
            self.w2_bias = nn.Parameter(torch.empty(self.num_local, hidden_size, dtype=dtype))
        # Where the weights are no longer float (quantize_ or a GGUF file): their stacked forms.
        self.w13: ExpertWeights | None = None
        # The CPU kernel bound to the weights it last ran on, and what identifies them (bind_fused_moe).
        self._cpu_call: tuple[tuple[object, ...], FusedMoECall | None] | None = None
        self.w2: ExpertWeights | None = None
        self._received: dict[str, set[tuple[int, int | None]]] = {}
        self._quantized: dict[str, dict[int, dict[int | None, object]]] = {}  # a quantized checkpoint's experts

    # -- loading ---------------------------------------------------------------------------------

    def _expert_projection(self, name: str, parts: str) -> tuple[int, str, int | None]:
        """(expert, stacked parameter, half of w13) of a per-expert name "<expert>.<projection>",
        counted as received; ValueError for a name or expert this layer does not have."""
        expert_str, _, projection = parts.partition(".")
        if not expert_str.isdigit() or projection not in self.expert_names:
            raise ValueError(f"experts.{name} is no expert weight this layer knows")
        expert = int(expert_str)
        if expert >= self.spec.num_experts:
            raise ValueError(f"experts.{name}: expert {expert}, but the config has {self.spec.num_experts} experts")
        param_name, half = self.expert_names[projection]
        return expert, param_name, half

    def _local(self, expert: int) -> int | None:
        """This rank's index of a global expert (None: another rank's)."""
        local = expert - self.first_expert
        return local if 0 <= local < self.num_local else None

    def load_checkpoint_tensor(self, name: str, loaded: torch.Tensor) -> None:
        """A per-expert tensor, `name` relative to this module: "<expert>.<projection>.weight"."""
        parts, _, kind = name.rpartition(".")
        if kind not in ("weight", "bias"):
            raise ValueError(f"experts.{name} is no expert weight this layer knows")
        expert, param_name, half = self._expert_projection(name, parts)
        self._received.setdefault(f"{param_name}_{kind}", set()).add((expert, half))
        local = self._local(expert)
        if local is None:
            return  # another rank's expert
        if getattr(self, f"{param_name}_{kind}") is None:
            raise ValueError(f"experts.{name}: the config says these experts have no biases")
        self.load_expert(param_name, local, half, loaded, kind)

    def load_expert(self, param_name: str, local: int, half: int | None, loaded: torch.Tensor, kind: str) -> None:
        """The whole (unsharded) projection of one local expert, as the checkpoint holds it: gate or
        up [I, hidden] (bias [I]), or down [hidden, I] (bias [hidden])."""
        param = getattr(self, f"{param_name}_{kind}")
        hidden = self.hidden_size
        full = self.spec.intermediate_size
        start, size = self.channel_start, self.width
        if param_name == "w13":
            expected = (full, hidden) if kind == "weight" else (full,)
            if tuple(loaded.shape) != expected:
                raise WeightShapeError(tuple(loaded.shape), expected)
            param[local, half * size : (half + 1) * size].copy_(loaded[start : start + size])
            return
        expected = (hidden, full) if kind == "weight" else (hidden,)
        if tuple(loaded.shape) != expected:
            raise WeightShapeError(tuple(loaded.shape), expected)
        param[local].copy_(loaded[:, start : start + size] if kind == "weight" else loaded)

    def quantized_expert_slot(self, name: str) -> ExpertSlot:
        """Where a quantized checkpoint's expert projection `name` ("3.gate_proj") goes; counts it received."""
        expert, param, half = self._expert_projection(name, name)
        self._received.setdefault(f"{param}_weight", set()).add((expert, half))
        hidden, width = self.hidden_size, self.spec.intermediate_size
        full = (width, hidden) if param == "w13" else (hidden, width)
        shard = None
        if not self.ep and self.tp_size > 1:
            shard = Shard(0 if param == "w13" else 1, self.channel_start, self.width, width)
        return ExpertSlot(self._local(expert), param, half, full, shard)

    def drop_float_experts(self) -> None:
        """Before materialising: the checkpoint's experts are quantized, so no float copy is allocated."""
        if self.w13_weight.is_meta:
            empty = torch.empty(0, dtype=self.w13_weight.dtype, device="meta")
            self.w13_weight = nn.Parameter(empty, requires_grad=False)
            self.w2_weight = nn.Parameter(empty.clone(), requires_grad=False)
        self._cpu_call = None  # it holds the weights it was bound to

    def set_quantized_expert(self, slot: ExpertSlot, weight: object) -> None:
        """One local expert projection's quantized (or dense) weight, already cut to this rank."""
        parts = self._quantized.setdefault(slot.param, {})
        parts.setdefault(slot.local, {})[slot.half] = as_expert(weight)  # type: ignore[index]

    def finish_quantized_experts(self) -> set[str]:
        """Once every expert projection arrived: compute with them; the parameters so filled."""
        done = {p for p in self.loaded_params() if p in ("w13_weight", "w2_weight")}
        if done != {"w13_weight", "w2_weight"}:
            return set()
        w13 = self._quantized.get("w13", {})
        w2 = self._quantized.get("w2", {})
        hidden = self.hidden_size
        local = range(self.num_local)
        self.w13 = stacked_experts([[w13[e][0], w13[e][1]] for e in local], 2 * self.width, hidden)
        self.w2 = stacked_experts([[w2[e][None]] for e in local], hidden, self.width)
        empty = torch.empty(0, dtype=self.w13_weight.dtype, device=self.w13_weight.device)
        self.w13_weight = nn.Parameter(empty, requires_grad=False)
        self.w2_weight = nn.Parameter(empty.clone(), requires_grad=False)
        self._cpu_call = None  # it holds the weights it was bound to
        self._quantized.clear()
        return done

    def loaded_params(self) -> set[str]:
        """Local names of the parameters every expert's tensors have reached."""
        done = set()
        for name, got in self._received.items():
            halves = 2 if name.startswith("w13") else 1
            if len(got) == self.spec.num_experts * halves:
                done.add(name)
        return done

    # -- forms of the weights ----------------------------------------------------------------------

    def expert_weights(self) -> tuple[ExpertWeights, ExpertWeights]:
        if self.w13 is not None and self.w2 is not None:
            return self.w13, self.w2
        hidden = self.hidden_size
        return (
            ExpertWeights("float", self.w13_weight, 2 * self.width, hidden),
            ExpertWeights("float", self.w2_weight, hidden, self.width),
        )

    @torch.no_grad()
    def quantize_(self, method: str) -> tuple[int, int]:
        """The experts in int8 or int4 (`quantization=`); returns (bytes before, bytes after)."""
        w13, w2 = self.expert_weights()
        before = w13.nbytes + w2.nbytes
        self.w13, self.w2 = quantize_experts(w13, method), quantize_experts(w2, method)
        empty = torch.empty(0, dtype=self.w13_weight.dtype, device=self.w13_weight.device)
        self.w13_weight = nn.Parameter(empty, requires_grad=False)
        self.w2_weight = nn.Parameter(empty.clone(), requires_grad=False)
        self._cpu_call = None  # it holds the weights it was bound to
        return before, self.w13.nbytes + self.w2.nbytes

    # -- compute -------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        out = self.rank_output(x, topk_weights, topk_ids)
        return tp_all_reduce(out) if self.tp_size > 1 else out

    def rank_output(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the all-reduce: its experts (EP) or its channels of
        every expert (TP); under TP the down projection's bias joins once, on rank 0."""
        if self.ep:
            local = topk_ids - self.first_expert
            topk_ids = torch.where((local >= 0) & (local < self.num_local), local, -1).to(torch.int32)
        b2 = self.w2_bias if (self.ep or self.tp_rank == 0) else None
        return self.run_experts(x, topk_ids, topk_weights, self.w13_bias, b2)

    def run_experts(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        b13: torch.Tensor | None,
        b2: torch.Tensor | None,
    ) -> torch.Tensor:
        w13, w2 = self.expert_weights()
        s = self.spec
        args = (b13, b2, s.activation, s.swiglu_alpha, s.swiglu_limit)
        if (x.is_cuda or self.use_triton) and w13.kind == w2.kind == "float":
            from tram.model.layers.moe.triton_moe import triton_fused_moe  # triton: the gpu extra's

            return triton_fused_moe(x, topk_ids, topk_weights, w13.data, w2.data, *args)
        if x.device.type == "cpu" and self.fused_kernel_takes(x, topk_ids, w13, w2):
            call = self.cpu_call(x, w13, w2, b13, b2)
            out = None if call is None else call(x, topk_ids, topk_weights)
            if out is not None:
                return out
        return grouped_moe(x, topk_ids, topk_weights, w13, w2, *args)

    def cpu_call(
        self, x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights, b13: torch.Tensor | None, b2: torch.Tensor | None
    ) -> FusedMoECall | None:
        """The fused kernel bound to these weights, checked once while they stay the same tensors."""
        key = (x.dtype, w13.data.data_ptr(), w2.data.data_ptr(), w13.kind, w2.kind, b13 is None, b2 is None)
        if self._cpu_call is None or self._cpu_call[0] != key:
            s = self.spec
            call = bind_fused_moe(x, w13, w2, b13, b2, s.activation, s.swiglu_alpha, s.swiglu_limit)
            self._cpu_call = (key, call)
        return self._cpu_call[1]

    def fused_kernel_takes(
        self, x: torch.Tensor, topk_ids: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights
    ) -> bool:
        """Whether the C++ kernel runs this step: it streams each active expert's weights once for all
        its tokens, which wins while experts get a few tokens each (decode, small prefills); with many
        tokens per expert the grouped path's GEMMs (oneDNN, MKL) win, except for bfloat16 experts, whose
        busy experts the kernel itself gives to AMX tiles or oneDNN's GEMM. GGUF K-quant experts with
        int8 activations take the kernel at every token count (its integer products are the same
        whatever the batch, and cheaper than decoding to float); other int8-activation experts the
        grouped path."""
        if w13.int8_activations or w2.int8_activations:
            return takes_int8_activations(w13, w2)
        if takes_every_token_count(x, w13, w2):
            return True
        slots_per_expert = topk_ids.numel() / max(1, self.num_local)
        return slots_per_expert <= FUSED_MAX_SLOTS_PER_EXPERT
