"""Speculative decoding's proposers: each drafts a few tokens per request after a step, and the next
step verifies them in one forward pass (the worker's rejection sampler keeps what the target model
itself would have produced). The scheduler learns only the drafts (lookahead slots) and how many
were accepted (computed counts roll back); it never imports a proposer.

Importing this package registers the methods (torch-free); a proposer is built by name
(`make_proposer`) in the worker.
"""

from __future__ import annotations

from typing import Any

from tram.config.registry import SPECULATIVE_METHODS

SPECULATIVE_METHODS.add(
    "ngram",
    "prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens",
    target="tram.spec_decode.ngram:NgramProposer",
)
SPECULATIVE_METHODS.add(
    "draft_model",
    "a smaller model with the target's tokenizer drafts greedily; its K/V sits in the target's blocks",
    target="tram.spec_decode.draft_model:DraftModelProposer",
)
SPECULATIVE_METHODS.add(
    "eagle",
    "an EAGLE head drafts from the target's last hidden states (its checkpoint: fc, layers.N)",
    target="tram.spec_decode.eagle:EagleProposer",
)
SPECULATIVE_METHODS.add(
    "eagle3",
    "an EAGLE-3 head drafts from three of the target's layers (its checkpoint: fc, midlayer, d2t)",
    target="tram.spec_decode.eagle:EagleProposer",
)
# The methods that run a model of their own (speculative_config's `model`): the engine reads its
# config at start, and the scheduler keeps lookahead slots for the K/V of the tokens it proposes.
MODEL_METHODS = frozenset({"draft_model", "eagle", "eagle3"})


def make_proposer(config: Any) -> Any:
    """The proposer `config.method` names, built from the SpeculativeConfig."""
    return SPECULATIVE_METHODS.load(config.method)(config)
