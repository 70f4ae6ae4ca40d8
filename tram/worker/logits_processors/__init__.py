"""Sampling features as logits processors, each owning its per-batch tensors (see base.py).

`LOGITS_PROCESSORS` is the order they run in, which follows vLLM: the structured-output grammar
bitmask first, then allowed_token_ids, min_tokens, logit_bias and the penalties can change the
greedy pick; min_p runs after temperature.
"""

from tram.worker.logits_processors.allowed_tokens import AllowedTokenIdsProcessor
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow, Stage
from tram.worker.logits_processors.grammar_bitmask import GrammarBitmaskProcessor
from tram.worker.logits_processors.logit_bias import LogitBiasProcessor, TokenBias
from tram.worker.logits_processors.min_p import MinPProcessor
from tram.worker.logits_processors.min_tokens import MinTokensProcessor, TokenMask
from tram.worker.logits_processors.penalties import PenaltiesProcessor

LOGITS_PROCESSORS: tuple[type[LogitsProcessor], ...] = (
    GrammarBitmaskProcessor,
    AllowedTokenIdsProcessor,
    MinTokensProcessor,
    LogitBiasProcessor,
    PenaltiesProcessor,
    MinPProcessor,
)

__all__ = [
    "LOGITS_PROCESSORS",
    "AllowedTokenIdsProcessor",
    "GrammarBitmaskProcessor",
    "LogitBiasProcessor",
    "LogitsProcessor",
    "MinPProcessor",
    "MinTokensProcessor",
    "PenaltiesProcessor",
    "SamplingRow",
    "Stage",
    "TokenBias",
    "TokenMask",
]
