"""Choices that a layer owns, registered by name in that layer; configuration names them as strings.

A kind of choice (attention backends, executor backends, quantization methods, ...) is a `ChoiceKind`
declared here with the setting that names it. The layer that owns the choices registers each name
when it is imported (`add`, or `@register` on the class it names): a help line for `--help`,
optionally a `target` (what the layer builds for the name, or "module:attr" of it, imported only
when used, so that registering a name never imports torch) and aliases. A layer may add up-front
checks too (Ray installed, a GGUF file, the device): they see every value the setting is given,
with the settings that give it, and raise ValueError.

Configuration imports nothing of Tram's, so it validates against whatever has been registered: the
entry points (the command line, the engine's resolution of EngineArgs) import the layers'
registrations first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
Check = Callable[[str, Any], None]  # (the value given, the settings giving it); ValueError to refuse


@dataclass(frozen=True)
class Choice:
    """One registered name: what `--help` says of it, and what the layer builds for it."""

    name: str
    help: str = ""
    target: Any = None  # an object, or "module:attr" naming one (imported by `load`)
    alias_of: str | None = None  # another spelling of the registered name `alias_of`


def import_target(target: str) -> Any:
    """The object a "module:attr" string names."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


class ChoiceKind:
    """The names a layer has registered for one setting, in registration order."""

    def __init__(self, setting: str, what: str) -> None:
        self.setting = setting  # the settings field that names a choice of this kind
        self.what = what  # how messages name one choice ("attention backend")
        self._choices: dict[str, Choice] = {}
        self._checks: dict[str, Check] = {}  # by qualified name: a reloaded module replaces its own
        self._default: Callable[..., str] | None = None

    def add(self, name: str, help: str = "", *, target: Any = None, aliases: tuple[str, ...] = ()) -> None:
        """Register `name` with what the layer builds for it (None: nothing to build). Registering a
        name again replaces it (a reloaded module)."""
        self._choices[name] = Choice(name, help, target)
        for alias in aliases:
            self._choices[alias] = Choice(alias, f"= {name}", target, alias_of=name)

    def register(self, name: str, help: str = "", *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """A decorator: register the decorated class or function as `name`'s target."""

        def add(obj: T) -> T:
            self.add(name, help, target=obj, aliases=aliases)
            return obj

        return add

    def add_check(self, check: Check) -> Check:
        """An up-front check of the value this kind's setting is given (run before the name lookup,
        so that the layer may refuse an unknown name in its own words)."""
        self._checks[f"{check.__module__}.{check.__qualname__}"] = check
        return check

    def set_default(self, choose: Callable[..., str]) -> Callable[..., str]:
        """The layer's rule for the name to use where the setting is left unset (None), from what is
        known where it is resolved (the device type, the world size)."""
        self._default = choose
        return choose

    def default(self, *context: Any) -> str:
        """The registered name the layer's rule picks for `context`."""
        if self._default is None:
            raise LookupError(f"no default {self.what} is registered in this process")
        return self._default(*context)

    def __contains__(self, name: object) -> bool:
        return name in self._choices

    def __iter__(self) -> Iterator[str]:
        return iter(self._choices)

    def names(self) -> tuple[str, ...]:
        return tuple(self._choices)

    def get(self, name: str) -> Choice:
        """The registered choice; ValueError listing the registered names otherwise."""
        choice = self._choices.get(name)
        if choice is None:
            raise self.unknown(f"{self.setting} {name!r}")
        return choice

    def canonical(self, name: str) -> str:
        """The registered name that `name` spells (itself unless an alias)."""
        return self.get(name).alias_of or name

    def load(self, name: str) -> Any:
        """What the layer builds for `name`: its target, imported if it is a "module:attr" string."""
        target = self.get(name).target
        return import_target(target) if isinstance(target, str) else target

    def unknown(self, label: str) -> ValueError:
        names = ", ".join(self._choices) or f"none (no {self.what} is registered in this process)"
        return ValueError(f"{label} is not supported: choose one of {names}")

    def validate(self, value: str, settings: Any, label: str, default: Any = None) -> None:
        """Run the layers' checks, then require a registered name. The setting's declared default
        needs no lookup: it is valid by declaration, even where its layer is not imported."""
        for check in self._checks.values():
            check(value, settings)
        if value not in self._choices and value != default:
            raise self.unknown(label)

    def help_text(self) -> str:
        """The registered names with their help lines, as `--help` lists them."""
        return ", ".join(f"{c.name} ({c.help})" if c.help else c.name for c in self._choices.values())


# The kinds of choice the settings name, each filled by the layer that owns it: model/attention,
# executor/backends.py, model/choices.py (model/quant's names, GGUF's), structured_output/backend.py,
# server/tools/parsers, server/reasoning and spec_decode (the proposers).
ATTENTION_BACKENDS = ChoiceKind("attention_backend", "attention backend")
EXECUTOR_BACKENDS = ChoiceKind("distributed_executor_backend", "executor backend")
QUANTIZATION_METHODS = ChoiceKind("quantization", "quantization method")
GGUF_ACTIVATIONS = ChoiceKind("gguf_activations", "GGUF activation type")
STRUCTURED_OUTPUTS_BACKENDS = ChoiceKind("structured_outputs_backend", "grammar backend")
TOOL_CALL_PARSERS = ChoiceKind("tool_call_parser", "tool call parser")
REASONING_PARSERS = ChoiceKind("reasoning_parser", "reasoning parser")
SPECULATIVE_METHODS = ChoiceKind("speculative_config", "speculative decoding method")
