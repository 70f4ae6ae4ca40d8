"""A tiny "thinking" model for the reasoning tests: the stories260K tokenizer plus `<think>` and
`</think>` as added tokens, a chat template that opens the thinking in the prompt (Qwen3's switch
`enable_thinking` false closes it there instead), and weights that make it say one fixed thing.

The weights make the next token a function of the current one (every layer's output projections
are zero, so the last hidden state is the current token's embedding; the embeddings of the tokens
that matter are orthonormal, and the LM head maps each to its successor with a large logit). So
after `<think>` it writes REASONING, `</think>`, ANSWER and its end-of-sequence token, sampled or
greedy; after a prompt whose thinking is closed it writes ANSWER at once. Tokens outside the chain
have zero embeddings and so uniform logits: under a grammar the model writes whatever it allows.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from server_pool import ServerSpec
from server_utils import RemoteServer

STORIES_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "stories260K"))
REASONING = ("▁Once", "▁upon", "▁time")
ANSWER = ("▁Lily", "▁was", "▁happy")
THINK, END_THINK = "<think>", "</think>"
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}A:{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>{% endif %}{% endif %}"
)
LOGIT = 4.0  # x 8 (RMSNorm of a unit vector in 64 dimensions): every other token is e^-32 as likely


def words(pieces: tuple[str, ...]) -> list[str]:
    return [p.lstrip("▁") for p in pieces]


def build_thinking_model(folder: str | Path) -> str:
    from transformers import AddedToken, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(STORIES_DIR)
    # Not special (as Qwen3's and DeepSeek-R1's): the detokenizer keeps them in the text.
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in (THINK, END_THINK)])
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    shutil.copy(os.path.join(STORIES_DIR, "generation_config.json"), folder / "generation_config.json")
    vocab = tokenizer.get_vocab()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    closed = tokenizer(text, add_special_tokens=False)["input_ids"]
    chain = [vocab[THINK], *(vocab[p] for p in REASONING), vocab[END_THINK], *(vocab[p] for p in ANSWER)]
    successors = {a: b for a, b in zip(chain, chain[1:])}
    successors[chain[-1]] = tokenizer.eos_token_id
    successors[closed[-1]] = vocab[ANSWER[0]]  # the closed prompt's last token starts the answer

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
        basis = torch.eye(config.hidden_size)
        sources = sorted(successors)
        embed = model.model.embed_tokens.weight
        for k, token in enumerate(sources):
            embed[token] = basis[k]
            model.lm_head.weight[successors[token]] += LOGIT * basis[k]
    model.save_pretrained(folder)
    return str(folder)


# One folder per test session (built by the first server that needs it), removed as the session ends.
MODEL_DIR = os.path.join(tempfile.gettempdir(), f"tram-thinking-model-{os.getpid()}")


@dataclass(frozen=True)
class ThinkingModelSpec(ServerSpec):
    """A server of the thinking model, which is built as the server starts: in server_pool's
    background start a module ahead, so that the build, too, overlaps with other tests."""

    model: str = MODEL_DIR

    def start(self) -> RemoteServer:
        if not os.path.isfile(os.path.join(self.model, "model.safetensors")):
            atexit.register(shutil.rmtree, self.model, ignore_errors=True)
            build_thinking_model(self.model)
        return super().start()
