"""What `tram bench throughput` says of speculative decoding: the timed run's acceptance, and the
speed-up that acceptance allows in theory (Leviathan et al., 2023), to set beside the measured one.

A verification step yields its accepted drafts plus one token, so with a free proposer (n-gram) the
ceiling is the mean acceptance length. A draft model costs c of a target step per forward; the
proposer runs k of them, so the ceiling is the mean acceptance length over 1 + c·k (the paper's
formula with the measured length in place of its i.i.d. acceptance). Decode reads every weight once
per forward, so c is estimated as the draft's weight bytes over the target's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def spec_summary(before: Any, after: Any) -> dict[str, Any]:
    """The timed run's drafts: acceptance rate, mean acceptance length, acceptance per position."""
    b = before or type(after)()
    drafts, tokens = after.num_drafts - b.num_drafts, after.num_draft_tokens - b.num_draft_tokens
    accepted = after.num_accepted_tokens - b.num_accepted_tokens
    per_pos = [
        (n - (b.accepted_per_pos[i] if i < len(b.accepted_per_pos) else 0)) / max(drafts, 1)
        for i, n in enumerate(after.accepted_per_pos)
    ]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / tokens if tokens else 0.0,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,
        "acceptance_per_position": per_pos,
    }


def weight_bytes(model: str) -> int | None:
    """The bytes of a local checkpoint's weight files (None: not a local folder or file)."""
    path = Path(model)
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.iterdir() if f.name.endswith(WEIGHT_SUFFIXES)) or None


def draft_cost(target: str, spec_json: str | None) -> float | None:
    """c: a draft forward's cost over a target forward's (0 for a proposer with no model; None when
    the weights are not local)."""
    spec = json.loads(spec_json) if spec_json else {}
    if not spec.get("model"):
        return 0.0
    draft, whole = weight_bytes(spec["model"]), weight_bytes(target)
    return draft / whole if draft and whole else None


def theoretical_speedup(summary: dict[str, Any], k: int, cost: float | None) -> float | None:
    """The speed-up the measured acceptance allows: mean acceptance length over 1 + c·k."""
    if cost is None or not summary.get("num_drafts"):
        return None
    return summary["mean_acceptance_length"] / (1 + cost * k)


def spec_line(summary: dict[str, Any], ratio: float) -> str:
    theory = summary.get("theoretical_speedup")
    told = "" if theory is None else f"; in theory {theory:.2f}x (c = {summary['draft_cost']:.2f})"
    rate, length = summary.get("acceptance_rate", 0), summary.get("mean_acceptance_length", 0)
    per_pos = ", ".join(f"{r:.2f}" for r in summary.get("acceptance_per_position", []))
    return (
        f"speculation: tram-spec / tram = {ratio:.2f}x output tokens/s{told}; acceptance rate {rate:.2f}, "
        f"mean acceptance length {length:.2f}, per position {per_pos}"
    )
