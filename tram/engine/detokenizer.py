"""Incremental detokenization of one request, with stop strings and the text each token added.

Why `tokenizers.decoders.DecodeStream` and not the classic prefix_offset/read_offset loop over
convert_ids_to_tokens: the stream runs the tokenizer's real decoder pipeline in Rust (byte fallback,
byte-level BPE, metaspace and strip rules all come for free, and they match `tokenizer.decode`), it
withholds text while the bytes of a character are incomplete, and it is cheap (one Rust call per token). Its
gaps are covered here:

* Priming with prompt ids works only when the primed ids decode cleanly; if they end inside a
  character the stream silently keeps an empty prefix and would replay the prompt text as output.
  `_prime_stream` picks a short clean prompt suffix and feeds any incomplete tail as held tokens.
* It raises "Invalid prefix" when later tokens rewrite earlier text (byte fallback turns an already
  emitted valid run into U+FFFD when an invalid byte joins it; only malformed output does this).
  `_step` restarts the stream on the held tokens; text already streamed is never taken back.
* Bytes of a character that never completes (generation cut off mid-character) are never emitted,
  as in vLLM: the user sees no trailing U+FFFD.
* It returns the text of a call, and logprobs need the text of each token: `update` steps one id
  at a time anyway and keeps what each added (`last_texts`; the rule is in `logprob_text`).
* It has no `spaces_between_special_tokens`. As in vLLM's fast detokenizer, with False (and special
  tokens rendered) an added token right after another added token is emitted as its bare content,
  without the space the decoder may put before it. The prompt's last token counts as "before".
"""

from __future__ import annotations

import weakref
from typing import Any

from tokenizers.decoders import DecodeStream

from tram.engine.text_buffer import TextBuffer

_REPLACEMENT = "\ufffd"
# Enough prompt context for the decoder's left-sensitive rules (leading-space strip, metaspace).
_MIN_PRIME_TOKENS = 6
_MAX_PRIME_TOKENS = 24
_MAX_TAIL_TOKENS = 3
_INVALID_PREFIX = "Invalid prefix"


class IncrementalDetokenizer:
    """Turns one request's output token ids into text as they arrive, and watches for stop strings.

    `update` feeds new token ids; `get_next_output_text` hands out the text for streaming without
    exposing a partial stop string; `output_text` is the whole text so far (truncated at a matched
    stop string). Each update costs O(new tokens + longest stop string), whatever was generated
    before: the text lives in a `TextBuffer` and stop strings are searched in a bounded window.
    `stop` is taken as given (`SamplingParams` has normalised it).
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._backend = tokenizer.backend_tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._held_ids: list[int] = []  # fed to the stream but not yet rendered (incomplete bytes)
        self._stream = self._prime_stream(prompt_token_ids)
        self._text = TextBuffer()
        self.stop = stop or []
        self.include_stop_str_in_output = include_stop_str_in_output
        self.stop_string: str | None = None  # set once a stop string ended the request
        # How many ids of the update that matched it the stop string needed: the ids after them
        # (several tokens arrive in one step under speculative decoding) are dropped.
        self.stop_ids_needed = 0
        max_stop_len = max((len(s) for s in self.stop), default=0)
        self._stop_window = max(max_stop_len - 1, 0)
        # An included stop string is output anyway, so its prefix may stream early.
        self._stream_holdback = 0 if include_stop_str_in_output else self._stop_window
        self._streamed_len = 0
        # What each id of the last update added to the text (before any stop-string truncation),
        # and the ids held (an unfinished character) before some of them, by position.
        self.last_texts: list[str] = []
        self.last_pending: dict[int, list[int]] | None = None
        # Skipped specials are never rendered, so there is nothing to put spaces between (as vLLM).
        self._added_tokens: dict[int, str] | None = None
        self._last_added = False
        if not spaces_between_special_tokens and not skip_special_tokens:
            self._added_tokens = _added_tokens(tokenizer)
            self._last_added = bool(prompt_token_ids) and prompt_token_ids[-1] in self._added_tokens

    @property
    def output_text(self) -> str:
        return self._text.text()

    def _prime_stream(self, prompt_token_ids: list[int]) -> DecodeStream:
        primer, tail = _split_prompt_tail(self._backend, prompt_token_ids, self._skip_special_tokens)
        stream = DecodeStream(primer, skip_special_tokens=self._skip_special_tokens)
        # The tail ends inside a character; it stays held so that a generated token completing
        # the character renders it (the prompt's own complete text is never replayed).
        for token_id in tail:
            if stream.step(self._backend, token_id) is None:
                self._held_ids.append(token_id)
            else:
                self._held_ids.clear()
        return stream

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Decode `new_token_ids`; return the stop string that ended the request, if one matched.

        With `stop_terminated` the last id is the stop token that ended the request; like vLLM it
        is rendered only when include_stop_str_in_output is set.
        """
        if self.stop_string is not None or not new_token_ids:
            self.last_texts, self.last_pending = [""] * len(new_token_ids), None
            return None  # nothing after a matched stop string may reach the text
        rendered = new_token_ids
        if stop_terminated and not self.include_stop_str_in_output:
            rendered = new_token_ids[:-1]
        self._render(rendered)
        if len(rendered) < len(new_token_ids):
            self.last_texts.append("")  # the unrendered stop token adds nothing
        new_text = "".join(self.last_texts)
        if not new_text:
            return None
        old_len = len(self._text)
        self._text.append(new_text)
        if not self.stop:
            return None
        return self._check_stop(old_len)

    def _render(self, token_ids: list[int]) -> None:
        if len(token_ids) == 1 and not self._held_ids:  # a decode step outside a character: no loop
            self.last_texts, self.last_pending = [self._step(token_ids[0])], None
            return
        texts: list[str] = []
        pending: dict[int, list[int]] | None = None
        for i, token_id in enumerate(token_ids):
            if self._held_ids:  # rare: only inside a character split over tokens
                pending = pending if pending is not None else {}
                pending[i] = list(self._held_ids)
            texts.append(self._step(token_id))
        self.last_texts, self.last_pending = texts, pending

    def _step(self, token_id: int) -> str:
        # One id per call: a multi-id step withholds everything when its last id is incomplete, and
        # a held complete word would be lost if the request ends there.
        try:
            piece = self._stream.step(self._backend, token_id)
        except Exception as e:  # tokenizers raises a bare Exception for this
            if _INVALID_PREFIX not in str(e):
                raise
            piece = self._restart_stream(token_id)
        if self._added_tokens is not None:
            piece = self._without_space_between_added(token_id, piece)
        if piece is None:
            self._held_ids.append(token_id)
            return ""
        self._held_ids.clear()
        return piece

    def _without_space_between_added(self, token_id: int, piece: str | None) -> str | None:
        # The decoder may put a space before an added token (WordPiece joins every token with one);
        # spaces_between_special_tokens=False asks for its bare content after another added token.
        content = self._added_tokens.get(token_id)  # type: ignore[union-attr]
        if content is not None and self._last_added and piece is not None:
            piece = content
        self._last_added = content is not None
        return piece

    def _restart_stream(self, token_id: int) -> str | None:
        # Decoding restarts from the held ids alone. With byte fallback they start with the byte
        # token that broke the run, so the decoder's leading-space strip has nothing to eat.
        self._stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
        ids = self._held_ids + [token_id]
        self._held_ids = []
        piece = self._stream.step(self._backend, ids)
        if piece is None:
            self._held_ids = ids[:-1]  # _step appends token_id itself
        return piece

    def _check_stop(self, old_len: int) -> str | None:
        # A match must end in the new text (the old text had none), so scanning from
        # (max stop length - 1) characters before it catches stop strings straddling tokens.
        search_from = max(old_len - self._stop_window, 0)
        window = self._text.suffix(search_from)
        best: tuple[int, int, str] | None = None  # (end, start, stop string) within the window
        for stop_str in self.stop:
            start = window.find(stop_str)
            if start == -1:
                continue
            candidate = (start + len(stop_str), start, stop_str)
            if best is None or candidate < best:
                best = candidate
        if best is None:
            return None
        # The stop string that completes first wins: that is what token-by-token decoding would
        # see, so the result does not depend on how the tokens were chunked. What is cut was held
        # back from streaming (it lies within the last max-stop-length - 1 characters).
        end, start, stop_str = best
        self._text.truncate(search_from + (end if self.include_stop_str_in_output else start))
        self.stop_string = stop_str
        self.stop_ids_needed = _ids_reaching(self.last_texts, search_from + end - old_len)
        return stop_str

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """Text to stream now: the whole text, or with `delta` only what was not handed out before.

        Until the request finishes, the last (max stop length - 1) characters are held back so a
        stop string that is still being completed never reaches the client. A delta costs
        O(new text + hold-back); the whole text costs O(length).
        """
        holdback = 0 if finished else self._stream_holdback
        ready_len = max(0, len(self._text) - holdback)
        if not delta:
            text = self._text.text()
            return text[:ready_len] if holdback else text
        if ready_len <= self._streamed_len:
            return ""
        start, self._streamed_len = self._streamed_len, ready_len
        return self._text.slice(start, ready_len)


def _ids_reaching(texts: list[str], length: int) -> int:
    """How many of the pieces `texts` it takes to reach `length` characters of their joined text."""
    total = 0
    for i, piece in enumerate(texts):
        total += len(piece)
        if total >= length:
            return i + 1
    return len(texts)


def _split_prompt_tail(
    backend: Any, prompt_token_ids: list[int], skip_special_tokens: bool
) -> tuple[list[int], list[int]]:
    """(primer, tail): a short end of the prompt that decodes cleanly, and the few ids after it.

    A primer cut inside a multi-byte character would decode as U+FFFD and poison a byte run that
    the output continues, so it must start and end on character boundaries. The tail is empty
    unless the prompt itself ends inside a character (at most 3 ids: a character has <= 4 bytes).
    With no clean end near the prompt's end (long invalid byte runs) nothing primes the stream.
    """
    n = len(prompt_token_ids)
    for cut in range(n, max(n - _MAX_TAIL_TOKENS, 0) - 1, -1):
        if cut == 0:
            return [], prompt_token_ids
        for size in _primer_sizes(cut):
            primer = prompt_token_ids[cut - size : cut]
            if _REPLACEMENT not in backend.decode(primer, skip_special_tokens=skip_special_tokens):
                return primer, prompt_token_ids[cut:]
    return [], []


def _primer_sizes(available: int) -> list[int]:
    # Prefer a few tokens of context; shorter primers are the last resort before giving up.
    longer = range(min(_MIN_PRIME_TOKENS, available), min(_MAX_PRIME_TOKENS, available) + 1)
    shorter = range(min(_MIN_PRIME_TOKENS, available) - 1, 0, -1)
    return [*longer, *shorter]


_added_tokens_cache: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def _added_tokens(tokenizer: Any) -> dict[int, str]:
    """Token id -> content of every added token (special or not), built once per tokenizer."""
    added = _added_tokens_cache.get(tokenizer)
    if added is None:
        decoder = tokenizer.backend_tokenizer.get_added_tokens_decoder()
        added = _added_tokens_cache.setdefault(tokenizer, {i: t.content for i, t in decoder.items()})
    return added
