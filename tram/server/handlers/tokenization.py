"""vLLM's POST /tokenize (a prompt, or chat messages through the template, to token ids) and POST
/detokenize (token ids to text).

They take what the generating routes take and no more: a text that provably cannot fit the context
(by its characters, or by the tokens of its first pieces) is refused before it is tokenized, as a
completion's is, and more token ids than the context holds are refused before they are decoded.
Both run on the tokenizer threads (tokenizer_threads.py), never on the event loop.
"""

from __future__ import annotations

from typing import Any

from tram.server.handlers.chat import OpenAIServingChat
from tram.server.protocol.errors import APIError
from tram.server.protocol.openai import DetokenizeRequest, TokenizeRequest


class ServingTokenization:
    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        chat = self.chat
        chat.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of 'prompt' and 'messages'")
        if body.messages is not None:
            ids = await chat.render(body)
        else:
            assert body.prompt is not None
            ids = await chat.tokenize(body.prompt, body.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": chat.max_model_len}

    async def detokenize(self, body: DetokenizeRequest) -> dict[str, Any]:
        chat = self.chat
        chat.check_model(body.model)
        limit = chat.max_model_len
        if len(body.tokens) > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, tokens holds "
                f"{len(body.tokens)} token ids, more than any prompt and completion of this model. "
                f"Please send at most {limit}.",
                "tokens",
                "context_length_exceeded",
            )
        vocab = chat.engine.config.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}", "tokens")
        tokenizer = chat.tokenizer
        if tokenizer is None:
            raise APIError(400, "This server has no tokenizer")
        return {"prompt": await chat.threads.run(len(body.tokens), tokenizer.decode, body.tokens)}
