"""Pipeline stages: which layers a stage owns, and cutting a model built whole (on the meta device,
so at no cost) down to one stage before it is materialised and loaded.

A stage keeps its contiguous run of decoder layers; the first stage also keeps the embedding, the
last the final norm and the LM head (and the embedding too when the head is tied to it). Whatever
a stage does not own becomes a `MissingLayer`, and the checkpoint weights under those names are
skipped by the loader (`missing_prefixes`).
"""

from __future__ import annotations

import torch
from torch import nn


class MissingLayer(nn.Module):
    """The place of a module another pipeline stage owns: no parameters, never called."""

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("this layer belongs to another pipeline stage")


def layer_range(num_layers: int, stage: int, num_stages: int) -> tuple[int, int]:
    """[start, end) of the stage's layers: as even as possible, earlier stages one longer when the
    split is uneven (5 layers over 2 stages: 3 and 2)."""
    if num_stages > num_layers:
        raise ValueError(f"pipeline_parallel_size {num_stages} exceeds the model's {num_layers} layers")
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return start, start + base + (1 if stage < extra else 0)


def cut_to_stage(model: nn.Module, stage: int, num_stages: int) -> None:
    """Replace what stage `stage` of `num_stages` does not own by MissingLayers; record the stage on
    the decoder (pp_start, pp_end, pp_first, pp_last) and the skipped names on the model."""
    decoder = model.model
    start, end = layer_range(len(decoder.layers), stage, num_stages)
    first, last = stage == 0, stage == num_stages - 1
    missing = [f"model.layers.{i}." for i in range(len(decoder.layers)) if not start <= i < end]
    for i in range(len(decoder.layers)):
        if not start <= i < end:
            decoder.layers[i] = MissingLayer()
    if not first and not (last and model.lm_head.tied):
        decoder.embed_tokens = MissingLayer()
        missing.append("model.embed_tokens.")
    if not last:
        decoder.norm = MissingLayer()
        model.lm_head = MissingLayer()
        missing += ["model.norm.", "lm_head."]
    set_stage(decoder, start, end, first, last)
    model.missing_prefixes = tuple(missing)


def set_stage(decoder: nn.Module, start: int, end: int, first: bool, last: bool) -> None:
    decoder.pp_start, decoder.pp_end, decoder.pp_first, decoder.pp_last = start, end, first, last
    decoder.local_layers = tuple(decoder.layers[start:end])
