"""The part of a tool-call stream that every format shares: one call object at a time through a
CallEmitter, the text held back until a call completes, and plain passthrough once a call is
malformed. A format says only what may stand between calls (`_outside`, `_finish_outside`) and
what follows a complete call (`_after_call`)."""

from __future__ import annotations

from abc import abstractmethod

from tram.server.tools.parsers.args_call import ArgsCall
from tram.server.tools.parsers.base import DeltaMessage, ToolCallStream
from tram.server.tools.parsers.deltas import CallEmitter, DeltaBuilder
from tram.server.tools.parsers.python_call import PythonCall
from tram.server.tools.parsers.xml_call import XmlCall

# A call being read: a `{"name", ...}` object, or a format's own (args_call.py, python_call.py,
# xml_call.py).
Call = CallEmitter | ArgsCall | PythonCall | XmlCall


class CallsStream(ToolCallStream):
    def __init__(self, arg_keys: tuple[str, ...]) -> None:
        self._arg_keys = arg_keys
        self._out = DeltaBuilder()
        self._call: Call | None = None
        self._calls = 0  # calls completed
        # Raw text since the last complete call that was neither sent as content nor used by a
        # complete call: the call in progress and whatever was held back before it.
        self._pending = ""

    def feed(self, delta_text: str) -> DeltaMessage | None:
        while delta_text:
            if self.malformed:
                self._spill(delta_text)
                break
            if self._call is not None:
                delta_text = self._feed_call(delta_text)
            else:
                delta_text = self._outside(delta_text)
        return self._out.take()

    def finish(self) -> DeltaMessage | None:
        if self._call is not None:
            self._fail("")  # the output ended inside a call
        elif not self.malformed:
            self._finish_outside()
        return self._out.take()

    def _begin_call(self, held: str, call: Call | None = None) -> None:
        """A call starts; `held` is the text before it that is not content yet. Without `call`, a
        `{"name", ...}` object."""
        self._pending = held
        self._call = call if call is not None else CallEmitter(self._calls, self._arg_keys, self._new_id())

    def _new_id(self) -> str | None:
        """The next call's id; None for the default (base.new_tool_call_id)."""
        return None

    def _feed_call(self, piece: str) -> str:
        assert self._call is not None
        used = self._call.feed(piece, self._out)
        self._pending += piece[:used]
        rest = piece[used:]
        if self._call.reader.error or (self._call.reader.done and not self._call.complete(self._out)):
            return self._fail(rest)
        if self._call.reader.done:
            self._call, self._pending = None, ""
            self._calls += 1
            self._after_call()
        return rest

    def _fail(self, rest: str) -> str:
        """The call in progress is malformed: what it and its lead-in held back is content, and so
        is everything after it."""
        self.malformed = True
        self._call = None
        self._spill(self._pending + rest)
        self._pending = ""
        return ""

    def _spill(self, text: str) -> None:
        """Text after a malformed call begins."""
        self._out.content(text)

    @abstractmethod
    def _outside(self, piece: str) -> str:
        """Take text outside any call; return the part from where a call object starts, after
        `_begin_call` (or "" when all of it was taken)."""

    @abstractmethod
    def _finish_outside(self) -> None:
        """The output ended outside a call: send or drop what is held back."""

    @abstractmethod
    def _after_call(self) -> None:
        """A call completed well formed."""
