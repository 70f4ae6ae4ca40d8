"""The EAGLE proposers (`eagle`, `eagle3`): a head (tram/model/models/eagle.py) drafts from the target's
features, its K/V at the target's slots like a draft model's (draft_model.py, whose cache handling
and one-token steps this reuses).

The head's K/V at position p holds token p+1 with the feature of p, so its first pass of a step runs
after sampling: over the step's positions, each fed the token after it (the batch's tokens, the
newly sampled ones included) and the target's feature there. Every step that proposes gets that
pass; a request whose positions a step without it missed is not drafted again (the features there
are gone: the worker's Drafter keeps count). Positions past a row's accepted tokens hold rejected
inputs until the next step writes over them. The pass's output at a row's position
n-2 (n: its tokens) predicts its first draft; each further draft is one one-token step of the head
on its own feature. A prefix-cache hit brings the head's K/V of the request that computed the block,
whose last position holds the token that followed it there: where the new request goes on
differently, that one position is off (acceptance, never output, can suffer), as in vLLM.
"""

from __future__ import annotations

import numpy as np
import torch

from tram.config import ModelConfig
from tram.config.speculative import SpeculativeConfig
from tram.model.attention.base import AttentionMetadata
from tram.model.hub import resolve_model_path
from tram.model.loader import safetensors_files
from tram.model.models.eagle import Eagle3LlamaForCausalLM, EagleLlamaForCausalLM, aux_hidden_layers
from tram.spec_decode.draft_model import DraftModelProposer, Spans

HEADS = {"eagle": EagleLlamaForCausalLM, "eagle3": Eagle3LlamaForCausalLM}


def checkpoint_names(model_config: ModelConfig) -> set[str]:
    """The tensor names of a head's checkpoint (none for random weights)."""
    from safetensors import safe_open

    if model_config.load_format == "dummy":
        return set()
    names: set[str] = set()
    for file in safetensors_files(resolve_model_path(model_config.model, model_config.revision)):
        with safe_open(file, framework="pt") as f:
            names.update(f.keys())
    return names


class EagleProposer(DraftModelProposer):
    catches_up = False

    def __init__(self, config: SpeculativeConfig) -> None:
        if config.method == "eagle":  # the first releases' fc has a bias, later ones none
            hf_config = config.draft_model_config.hf_config
            hf_config.eagle_fc_bias = "fc.bias" in checkpoint_names(config.draft_model_config)
        super().__init__(config, HEADS[config.method])
        self.eagle3 = config.method == "eagle3"
        # The step being run: its positions and metadata, the target's feature; after sampling, the
        # first pass's outputs and where each batch row's tokens start in them.
        self._step: tuple[torch.Tensor, AttentionMetadata, torch.Tensor] | None = None
        self._first: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rows: np.ndarray = np.zeros(0, dtype=np.int64)
        self._positions: np.ndarray = np.zeros(0, dtype=np.int64)

    def attach(self, target: torch.nn.Module) -> None:
        self.model.share_target(target)
        if self.eagle3:
            layers = len(target.model.layers)
            target.model.aux_hidden_layers = aux_hidden_layers(self.model_config.hf_config, layers)

    @torch.inference_mode()
    def run_step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        hidden: torch.Tensor,
        catch_up: Spans | None = None,
    ) -> None:
        aux = self.model.target.model.aux_hidden if self.eagle3 else None
        self._step = (positions, meta, self.model.target_feature(hidden, aux))

    @torch.inference_mode()
    def after_step(self, token_ids: np.ndarray, token_rows: np.ndarray, token_positions: np.ndarray) -> None:
        """The first pass: each of the step's positions with the token after it."""
        assert self._step is not None
        positions, meta, feature = self._step
        following = token_ids[token_rows, np.minimum(token_positions + 1, token_ids.shape[1] - 1)]
        ids = torch.from_numpy(following.astype(np.int64)).to(self.device)
        self._first = self.model(ids, positions, self.kv_caches, meta, feature)
        self._rows, self._positions, self._step = token_rows, token_positions, None

    @torch.inference_mode()
    def propose_batch(
        self, rows: np.ndarray, last_tokens: np.ndarray, positions: np.ndarray, tables: np.ndarray, num: int, limit: int
    ) -> np.ndarray:
        assert self._first is not None
        starts = np.searchsorted(self._rows, rows)
        index = torch.from_numpy(starts + (positions - 1 - self._positions[starts])).to(self.device)
        out, feature = self._first[0][index], self._first[1][index]
        tokens = self.model.draft_ids(out)
        drafts = [tokens]
        for j in range(1, num):
            pos, meta = self._meta(np.minimum(positions + j - 1, limit), tables=tables)
            out, feature = self.model(tokens, torch.from_numpy(pos).to(self.device), self.kv_caches, meta, feature)
            tokens = self.model.draft_ids(out)
            drafts.append(tokens)
        return torch.stack(drafts, dim=1).cpu().numpy()
