"""Experts whose checkpoint stacks every expert in one tensor per projection (gpt-oss), in bf16 or
in MXFP4 (blocks of 32 4-bit floats sharing one power-of-two scale), dequantized at load.

gpt-oss's tensors, as transformers and OpenAI's release store them:
  gate_up_proj [E, hidden, 2I] (input-major; gate and up interleaved: columns 0, 2, 4... are gate),
  gate_up_proj_bias [E, 2I] (interleaved alike), down_proj [E, I, hidden], down_proj_bias [E, hidden];
  MXFP4: <name>_blocks [E, out, in / 32, 16] uint8 (two e2m1 values a byte, low nibble first) and
  <name>_scales [E, out, in / 32] uint8 (an E8M0 exponent, bias 127), output-major.
Each is cut to this rank's experts (EP) or channels (TP) and stored in FusedMoE's layout.
"""

from __future__ import annotations

import torch

from tram.model.layers.moe.layer import FusedMoE
from tram.model.weight_utils import WeightShapeError

# e2m1: sign, two exponent bits, one mantissa bit.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., G, 16] uint8 blocks and [..., G] uint8 exponents -> [..., G * 32] float32."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match their scales {tuple(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    blocks = blocks.to(torch.uint8)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)  # [..., G, 16, 2]
    values = values.flatten(-2)  # [..., G, 32]: low nibble first
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return values.flatten(-2)


class StackedFusedMoE(FusedMoE):
    """FusedMoE loading gpt-oss's stacked (and MXFP4) expert tensors."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._complete: set[str] = set()
        self._pending: dict[str, torch.Tensor] = {}  # MXFP4 blocks or scales waiting for their pair

    def load_checkpoint_tensor(self, name: str, loaded: torch.Tensor) -> None:
        for suffix in ("_blocks", "_scales"):
            if name.endswith(suffix):
                base = name[: -len(suffix)]
                other = base + ("_scales" if suffix == "_blocks" else "_blocks")
                if other not in self._pending:
                    self._pending[name] = loaded.clone()
                    return
                pair = {name: loaded, other: self._pending.pop(other)}
                weight = dequantize_mxfp4(pair[base + "_blocks"], pair[base + "_scales"])  # [E, out, in]
                self._load_stacked(base, weight, output_major=True)
                return
        self._load_stacked(name, loaded, output_major=False)

    def _load_stacked(self, name: str, loaded: torch.Tensor, output_major: bool) -> None:
        experts, hidden, width = self.spec.num_experts, self.hidden_size, self.spec.intermediate_size
        expected = {
            "gate_up_proj": (experts, 2 * width, hidden) if output_major else (experts, hidden, 2 * width),
            "gate_up_proj_bias": (experts, 2 * width),
            "down_proj": (experts, hidden, width) if output_major else (experts, width, hidden),
            "down_proj_bias": (experts, hidden),
        }
        if name not in expected:
            raise ValueError(f"experts.{name} is no expert weight this layer knows")
        if tuple(loaded.shape) != expected[name]:
            raise WeightShapeError(tuple(loaded.shape), expected[name])
        mine = loaded[self.first_expert : self.first_expert + self.num_local]
        start, size = self.channel_start, self.width
        if name == "gate_up_proj" or name == "gate_up_proj_bias":
            if name == "gate_up_proj" and not output_major:
                mine = mine.transpose(1, 2)  # [E, 2I, hidden]
            target = self.w13_weight if name == "gate_up_proj" else self.w13_bias
            target[:, :size].copy_(mine[:, 0::2][:, start : start + size])
            target[:, size:].copy_(mine[:, 1::2][:, start : start + size])
            self._complete.add("w13_weight" if name == "gate_up_proj" else "w13_bias")
        elif name == "down_proj":
            if not output_major:
                mine = mine.transpose(1, 2)  # [E, hidden, I]
            self.w2_weight.copy_(mine[:, :, start : start + size])
            self._complete.add("w2_weight")
        else:
            self.w2_bias.copy_(mine)
            self._complete.add("w2_bias")

    def loaded_params(self) -> set[str]:
        return set(self._complete)
