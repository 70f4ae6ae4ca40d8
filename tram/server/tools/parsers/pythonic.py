"""Python-syntax tool calls (Llama 3.2, Llama 4, and models tuned on their format): the whole
output is a Python list of calls by keyword, optionally between Llama 4's `<|python_start|>` and
`<|python_end|>` (list_stream.py; one call: python_call.py):

    [get_weather(city="Paris", unit="celsius"), get_time()]

The values must be literals (strings, numbers, True/False/None, lists, tuples, dicts); they are
parsed with `ast`, never evaluated, and the arguments are their JSON object. A positional
argument, a value that is not a literal, or a name that is not an identifier is malformed.
"""

from __future__ import annotations

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.call_array import ListLeadIn
from tram.server.tools.parsers.list_stream import ListStream
from tram.server.tools.parsers.python_call import PythonCall

PYTHON_CALLS = ListLeadIn(r"[^\W\d]")  # a call begins with its name: an identifier's first letter


@TOOL_CALL_PARSERS.register("pythonic", "Llama 3.2/4: [f(a=1), g()]")
class PythonicToolParser(ToolParser):
    def stream(self) -> ToolCallStream:
        return _PythonicStream()


class _PythonicStream(ListStream):
    def __init__(self) -> None:
        super().__init__((), PYTHON_CALLS, ("<|python_start|>",), ("<|python_end|>",))

    def _next_call(self) -> PythonCall:
        return PythonCall(self._calls)
