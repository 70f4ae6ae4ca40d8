"""The draft-model proposer: a smaller model with the target's tokenizer proposes the next k tokens
greedily, one forward per token, for every drafted row at once.

Its K/V lives in cache tensors of its own, at the same slots as the target's: one block table, one
slot mapping, one computed count for both, so a rejected token's K/V is rolled back with the
target's by the computed count alone. The draft runs the inputs of every step that proposes after
the target (`run_step`); positions it missed in steps that did not propose (a prefill chunk, a
prefix-cache hit, tokens decoded while drafting was off) it first computes from their tokens
(`catch_up`, the worker's Drafter keeping count). Its proposals write K/V past the scheduled tokens,
into the lookahead slots the scheduler keeps (SchedulerConfig.num_lookahead_tokens); the next step
writes the verified tokens over them.

Greedy drafts are deterministic proposals: the rejection sampler accepts one with the target's own
probability of it (worker/rejection_sampler.py), so output stays the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tram.config.speculative import SpeculativeConfig
from tram.model.attention.base import AttentionMetadata
from tram.model.loader import load_model
from tram.model.registry import kv_cache_shape_info


class DraftModelProposer:
    """The draft model and its K/V caches (allocated by the worker, `bind_kv_caches`)."""

    batched = True  # proposes for many rows in one call (`propose_batch`), not row by row

    def __init__(self, config: SpeculativeConfig, model_class: type[nn.Module] | None = None) -> None:
        model_config = config.draft_model_config
        assert model_config is not None, "the engine reads the draft model's config at start"
        model_config.resolve()
        self.model_config = model_config
        self.device = model_config.torch_device
        self.model = load_model(model_config, model_class)
        self.num_layers, self.num_kv_heads, self.head_dim = kv_cache_shape_info(model_config.hf_config)
        self.kv_caches: list[torch.Tensor] = []
        self.block_size = 0

    def attach(self, target: nn.Module) -> None:
        """The target model it drafts for (a draft model needs nothing of it)."""

    def bind_kv_caches(self, kv_caches: list[torch.Tensor], block_size: int) -> None:
        """The draft's cache tensors, one per layer, over the pool's blocks."""
        assert len(kv_caches) == self.num_layers
        self.kv_caches, self.block_size = kv_caches, block_size

    # A draft model can compute the K/V of positions it missed from their tokens alone (an EAGLE head
    # needs the target's features there, which are gone).
    catches_up = True

    @torch.inference_mode()
    def run_step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        hidden: torch.Tensor,
        catch_up: Spans | None = None,
    ) -> None:
        """The target's step (and its hidden states) through the draft: its K/V at every slot the step
        writes; with `catch_up`, those spans instead (each row's missed positions and the step's)."""
        if catch_up is not None:
            pos, meta = self._meta(catch_up.starts, catch_up.ends, catch_up.tables)
            input_ids = torch.from_numpy(catch_up.tokens.astype(np.int64)).to(self.device)
            positions = torch.from_numpy(pos).to(self.device)
        self.model(input_ids, positions, self.kv_caches, meta)

    def after_step(self, token_ids: np.ndarray, token_rows: np.ndarray, token_positions: np.ndarray) -> None:
        """After the step's tokens were sampled (token_ids: the batch's, [rows, max_model_len]; the
        step's tokens' batch rows and positions): nothing for a draft model."""

    @torch.inference_mode()
    def propose_batch(
        self, rows: np.ndarray, last_tokens: np.ndarray, positions: np.ndarray, tables: np.ndarray, num: int, limit: int
    ) -> np.ndarray:
        """`num` greedy drafts for each of the batch `rows` ([B, num]): row i's last token sits at
        positions[i], and its blocks are tables[i]. No position past `limit` (the context's last) is
        written: a row that reaches it keeps writing there, and its drafts past it are not asked for."""
        tokens = torch.from_numpy(last_tokens.astype(np.int64)).to(self.device)
        drafts = []
        for j in range(num):
            pos, meta = self._meta(np.minimum(positions + j, limit), tables=tables)
            hidden = self.model(tokens, torch.from_numpy(pos).to(self.device), self.kv_caches, meta)
            tokens = self.model.compute_logits(hidden).argmax(dim=-1)
            drafts.append(tokens)
        return torch.stack(drafts, dim=1).cpu().numpy()

    def _meta(
        self, starts: np.ndarray, ends: np.ndarray | None = None, tables: np.ndarray | None = None
    ) -> tuple[np.ndarray, AttentionMetadata]:
        """Each row's positions [starts, ends) as one query over its blocks (tables); without ends, one
        token at each start. Returns the flattened positions and the metadata."""
        assert tables is not None
        ends = starts + 1 if ends is None else ends
        bs, n = self.block_size, len(starts)
        q = ends - starts
        cu = np.cumsum(q)
        rows = np.repeat(np.arange(n), q)
        positions = np.arange(int(cu[-1])) - np.repeat(cu - q - starts, q)
        slots = tables[rows, positions // bs].astype(np.int64) * bs + positions % bs
        width = -(-int(ends.max()) // bs)

        def dev(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=self.device, dtype=dtype)

        return positions, AttentionMetadata(
            num_tokens=len(positions),
            slot_mapping=dev(slots, torch.int64),
            query_start_loc=dev(np.concatenate([[0], cu]), torch.int32),
            seq_lens=dev(ends, torch.int32),
            block_tables=dev(tables[:, :width], torch.int32),
            query_lens_list=q.tolist(),
            seq_lens_list=ends.tolist(),
            max_query_len=int(q.max()),
            max_seq_len=int(ends.max()),
        )


@dataclass
class Spans:
    """Positions [starts, ends) of each of some rows, their tokens (flattened) and block tables."""

    tokens: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    tables: np.ndarray
