"""Building the DeltaMessage of one `feed`: content pieces and tool-call fragments, merged."""

from __future__ import annotations

from tram.server.tools.parsers.base import DeltaMessage, DeltaToolCall, new_tool_call_id
from tram.server.tools.parsers.call_reader import CallReader


class DeltaBuilder:
    """Collects what one `feed` or `finish` sends; fragments of the same call in a row merge into
    one DeltaToolCall, so a call's first delta carries its id, name and the arguments so far."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._calls: list[DeltaToolCall] = []

    def content(self, text: str) -> None:
        if text:
            self._content.append(text)

    def call(self, index: int, *, call_id: str | None = None, name: str | None = None, arguments: str = "") -> None:
        last = self._calls[-1] if self._calls else None
        if call_id is None and last is not None and last.index == index:
            last.arguments = (last.arguments or "") + arguments or None
        elif call_id is not None or arguments:
            self._calls.append(DeltaToolCall(index, call_id, name, arguments or None))

    def take(self) -> DeltaMessage | None:
        """The message so far (None if it would be empty), and start a new one."""
        if not self._content and not self._calls:
            return None
        message = DeltaMessage("".join(self._content) or None, self._calls)
        self._content, self._calls = [], []
        return message


class CallEmitter:
    """One call in a stream: its reader, its id, and what of it has been sent: the id and name as
    soon as the name is known, then the arguments as they arrive."""

    def __init__(self, index: int, arg_keys: tuple[str, ...], call_id: str | None = None) -> None:
        self.reader = CallReader(arg_keys)
        self.index = index
        self._id = call_id or new_tool_call_id()
        self._named = False

    def feed(self, piece: str, out: DeltaBuilder) -> int:
        """Read on into `piece`, send what became known; how many characters the call used."""
        used = self.reader.feed(piece)
        if self.reader.name is not None and not self.reader.error:
            if not self._named:
                out.call(self.index, call_id=self._id, name=self.reader.name)
                self._named = True
            out.call(self.index, arguments=self.reader.take_arguments())
        return used

    def complete(self, out: DeltaBuilder) -> bool:
        """Once the object has closed: whether it is a well-formed call (if it has no arguments
        member, "{}" is sent as its arguments)."""
        if self.reader.result() is None:
            return False
        if not self.reader.has_arguments:
            out.call(self.index, arguments="{}")
        return True
