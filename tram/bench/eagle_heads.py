"""Random-weight EAGLE heads for a target, in the layouts the published heads ship (config.json and one
safetensors file): what the EAGLE proposers are tested and measured with where no trained head can
be downloaded. Their drafts are seldom accepted; they prove the shapes, the loading and the
bookkeeping, not the speed-up.

    python3 -m tram.bench.eagle_heads --model ../shared/models/stories260K --method eagle3 --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_random_eagle_head(
    target: str | Path, method: str, out: str | Path, seed: int = 0, draft_vocab: int | None = None
) -> Path:
    """An `eagle` head (fc with a bias, one layer `layers.0` without an input norm, the target's
    embedding copied in as some releases carry it) or an `eagle3` head (fc over three layers,
    `midlayer`, norm, lm_head over `draft_vocab` tokens, d2t and t2d)."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(target) / "config.json").read_text())
    size, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or size // heads)
    vocab = int(config["vocab_size"])
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.05

    prefix = "layers.0" if method == "eagle" else "midlayer"
    width = size if method == "eagle" else 2 * size  # q, k and v read [embedding, feature] in EAGLE-3
    outs = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
    weights = {f"{prefix}.self_attn.{name}.weight": normal(rows, width) for name, rows in outs.items()}
    weights[f"{prefix}.self_attn.o_proj.weight"] = normal(size, heads * head_dim)
    weights[f"{prefix}.mlp.gate_proj.weight"] = normal(inter, size)
    weights[f"{prefix}.mlp.up_proj.weight"] = normal(inter, size)
    weights[f"{prefix}.mlp.down_proj.weight"] = normal(size, inter)
    weights[f"{prefix}.post_attention_layernorm.weight"] = 1 + normal(size)
    head_config = {**config, "num_hidden_layers": 1, "tie_word_embeddings": False}
    if method == "eagle":
        weights["fc.weight"], weights["fc.bias"] = normal(size, 2 * size), normal(size)
        weights["embed_tokens.weight"] = normal(vocab, size)  # skipped at load: the target's is used
        head_config["architectures"] = ["LlamaForCausalLM"]
    elif method == "eagle3":
        draft_vocab = draft_vocab or vocab // 2
        weights["fc.weight"] = normal(size, 3 * size)
        weights[f"{prefix}.input_layernorm.weight"] = 1 + normal(size)
        weights[f"{prefix}.hidden_norm.weight"] = 1 + normal(size)
        weights["norm.weight"] = 1 + normal(size)
        weights["lm_head.weight"] = normal(draft_vocab, size)
        # The draft vocabulary: a sorted random subset of the target's, as d2t offsets.
        kept = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
        weights["d2t"] = kept - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[kept] = True
        weights["t2d"] = t2d
        head_config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab)
    else:
        raise ValueError(f"method must be eagle or eagle3, got {method!r}")
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(head_config, indent=2))
    return dst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the target's Hugging Face folder")
    parser.add_argument("--method", choices=("eagle", "eagle3"), required=True)
    parser.add_argument("--out", required=True, help="the head's folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_random_eagle_head(args.model, args.method, args.out, args.seed))


if __name__ == "__main__":
    main()
