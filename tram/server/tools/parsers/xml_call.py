"""One Qwen3-Coder call, read piece by piece (qwen3_coder.py):

    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>

The id and name go out when `<function=name>` is read, then `{`, then each parameter as it closes
(`"city": "Paris"`, its value converted by the tool's schema: param_types.py), then `}` at
`</function>`. The arguments are made rather than sliced, by the same steps streamed or not. A
parameter may end without `</parameter>` where the next `<parameter=` or `</function>` begins (as
vLLM reads it); one newline after its `>` and one before its end are the format's, not the value's.
It keeps CallEmitter's interface, so CallsStream runs it like a JSON call object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tram.server.tools.parsers.base import new_tool_call_id
from tram.server.tools.parsers.deltas import DeltaBuilder
from tram.server.tools.parsers.param_types import convert_param

FUNCTION, PARAMETER = "<function=", "<parameter="
END_PARAMETER, END_FUNCTION = "</parameter>", "</function>"
_VALUE_ENDS = (END_PARAMETER, PARAMETER, END_FUNCTION)
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_BEFORE, _NAMING, _BETWEEN, _PARAM_NAME, _VALUE = range(5)

Properties = Callable[[str], "dict[str, Any] | None"]  # a tool's name to its parameters' schemas


class XmlCall:
    """Fed the text from anywhere before `<function=` (whitespace is skipped) until `done`
    (`</function>` was read) or `error` (the text cannot be such a call)."""

    def __init__(self, index: int, properties: Properties) -> None:
        self.index = index
        self.reader = self  # CallsStream asks the reader whether the call is done or went wrong
        self.done = False
        self.error = False
        self._id = new_tool_call_id()
        self._properties_of = properties
        self._properties: dict[str, Any] | None = None
        self._buf = ""  # read but not yet taken: a marker or value that may go on
        self._state = _BEFORE
        self._param = ""
        self._seen: set[str] = set()
        self._searched = 0  # how much of a value in _buf holds no end marker

    def feed(self, piece: str, out: DeltaBuilder) -> int:
        self._buf += piece
        while not (self.done or self.error) and self._step(out):
            pass
        if self.done:
            return len(piece) - len(self._buf)  # _buf is what followed </function>
        return len(piece)

    def complete(self, out: DeltaBuilder) -> bool:
        return True  # every check was made while reading

    def _step(self, out: DeltaBuilder) -> bool:
        """Take what the buffer allows in the current state; whether it moved on."""
        if self._state in (_NAMING, _PARAM_NAME):
            return self._read_name(out)
        if self._state == _VALUE:
            return self._read_value(out)
        self._buf = self._buf.lstrip()
        expected = (FUNCTION,) if self._state == _BEFORE else (PARAMETER, END_FUNCTION)
        for marker in expected:
            if self._buf.startswith(marker):
                self._buf = self._buf[len(marker) :]
                if marker == END_FUNCTION:
                    out.call(self.index, arguments="}")
                    self.done = True
                else:
                    self._state = _NAMING if marker == FUNCTION else _PARAM_NAME
                return True
        self.error = not any(marker.startswith(self._buf) for marker in expected)
        return False

    def _read_name(self, out: DeltaBuilder) -> bool:
        k = self._buf.find(">")
        if k < 0:
            return False
        name, self._buf = self._buf[:k].strip(), self._buf[k + 1 :]
        if self._state == _NAMING:
            if not _NAME.fullmatch(name):
                self.error = True
                return False
            self._properties = self._properties_of(name)
            out.call(self.index, call_id=self._id, name=name)
            out.call(self.index, arguments="{")
            self._state = _BETWEEN
            return True
        if not name or name in self._seen:
            self.error = True  # no name, or a parameter given twice
            return False
        self._param, self._state, self._searched = name, _VALUE, 0
        return True

    def _read_value(self, out: DeltaBuilder) -> bool:
        ends = [(k, m) for m in _VALUE_ENDS if (k := self._buf.find(m, self._searched)) >= 0]
        if not ends:
            self._searched = max(0, len(self._buf) - len(END_PARAMETER) + 1)
            return False
        k, marker = min(ends)
        value = self._buf[:k]
        self._buf = self._buf[k + len(marker) :] if marker == END_PARAMETER else self._buf[k:]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        converted = convert_param(value, self._properties, self._param)
        separator = ", " if self._seen else ""
        self._seen.add(self._param)
        member = json.dumps(self._param, ensure_ascii=False) + ": " + json.dumps(converted, ensure_ascii=False)
        out.call(self.index, arguments=separator + member)
        self._state = _BETWEEN
        return True
