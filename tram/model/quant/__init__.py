"""Quantized weights: on-the-fly int8/int4 today (weights.py, apply.py)."""
from tram.model.quant.apply import ON_THE_FLY, check_quantization, quantize_linears

__all__ = ["ON_THE_FLY", "check_quantization", "quantize_linears"]
