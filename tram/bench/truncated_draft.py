"""A draft model cut from its target: the target's embedding, its first `layers` decoder layers, its
final norm and LM head (the self-speculation of LayerSkip and Draft & Verify, without their training).
It shares the target's tokenizer by construction and drafts what the target's early layers already
predict, so it gives the draft-model proposer a real acceptance rate where no smaller sibling of a
model is at hand (stories260K here).

    python3 -m tram.bench.truncated_draft --model ../shared/models/stories260K --layers 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# Everything in the folder but the weights and the config: the tokenizer, templates, generation config.
SKIP = {"config.json", "model.safetensors", "model.safetensors.index.json"}


def write_truncated_draft(model: str | Path, layers: int, out: str | Path) -> Path:
    """Write the draft checkpoint to `out` (a Hugging Face folder with one safetensors file)."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(model), Path(out)
    config = json.loads((src / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 1 <= layers < total:
        raise ValueError(f"a draft keeps 1..{total - 1} of the target's {total} layers, not {layers}")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src} has no safetensors weights")
    kept = {}
    for f in files:
        for name, tensor in load_file(str(f)).items():
            m = LAYER.search(name)
            if m is None or int(m.group(1)) < layers:
                kept[name] = tensor.contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    for key in ("layer_types", "sliding_window_pattern"):
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.is_file() and f.name not in SKIP and not f.name.endswith(".safetensors"):
            shutil.copy(f, dst / f.name)
    return dst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the target's Hugging Face folder")
    parser.add_argument("--layers", type=int, required=True, help="decoder layers the draft keeps")
    parser.add_argument("--out", required=True, help="the draft's folder")
    args = parser.parse_args(argv)
    print(write_truncated_draft(args.model, args.layers, args.out))


if __name__ == "__main__":
    main()
