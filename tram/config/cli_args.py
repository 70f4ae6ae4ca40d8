"""Settings declared once as dataclass fields, turned into command-line flags.

A field's metadata carries its help text (and optionally `choices`, `positional`, `env`, `aliases`,
`off_flag`); its type and default come from the declaration itself. `add_arguments` derives an
argparse flag per field (`max_num_seqs` -> `--max-num-seqs`, booleans as `--x/--no-x`, lists as
`nargs="+"`), and `from_namespace` builds the dataclass back from the parsed flags, so nothing is
declared twice. Every flag's help ends with its default, so `--help` is the whole reference.

`choices` is a tuple of the values configuration itself owns, or a `ChoiceKind` whose names a layer
registers (registry.py); either way `check_choices` validates the field from it, so the allowed
values are stated once. A kind's names are listed in the help, and refused by `validate` (one
line naming the registered ones) rather than by argparse.

vLLM command lines are pasted here, so their spellings are accepted too: a positional setting may
also be given as a flag (`serve MODEL` or `serve --model MODEL`), a setting may have short aliases
(`-tp`), a boolean may have an extra flag that turns it off (`--disable-log-requests`), and a list
may be given as a JSON array (`--allowed-origins '["https://a.example"]'`). A dict setting is a JSON
object (`--speculative-config '{"method": "ngram", ...}'`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from typing import Any, TypeVar

from tram.config.registry import ChoiceKind

T = TypeVar("T")
_FLAG_SUFFIX = "__flag"  # namespace key of the flag spelling of a positional setting


def setting(
    default: Any,
    help: str,
    *,
    choices: typing.Sequence[str] | ChoiceKind | None = None,
    positional: bool = False,
    env: str | None = None,
    aliases: typing.Sequence[str] = (),
    off_flag: str | None = None,
) -> Any:
    """A dataclass field for one setting: its default, its one-line help, and how the CLI shows it.

    positional: the setting is a positional argument that may also be given as `--name`.
    env: an environment variable that supplies the default (its value is never shown in --help).
    aliases: more option strings for the flag (vLLM's `-tp`).
    off_flag: for a boolean, one more flag that sets it to False (vLLM's `--disable-log-requests`).
    """
    metadata = {
        "help": help,
        "choices": choices,
        "positional": positional,
        "env": env,
        "aliases": tuple(aliases),
        "off_flag": off_flag,
    }
    if positional:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, list):  # a mutable default: each instance gets its own copy
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value, from its default or its default factory."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether it is a list)."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0], True
    return annotation, False


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def default_text(default: Any, env: str | None = None) -> str:
    """How --help shows a default: `none` for None, lowercase booleans, lists space-separated."""
    if isinstance(default, bool):
        shown = str(default).lower()
    elif default is None:
        shown = "none"
    elif isinstance(default, (list, tuple)):
        shown = " ".join(map(str, default))
    else:
        shown = str(default)
    return f"${env} if set, else {shown}" if env else shown


def _help(meta: typing.Mapping[str, Any], default: Any) -> str:
    """The help text with a registered kind's names and the default; a help that already says
    "(default: ...)" explains its own."""
    text = meta["help"]
    kind = meta.get("choices")
    if isinstance(kind, ChoiceKind) and kind.names():
        text += f"; one of: {kind.help_text()}"
    if "(default" not in text:
        text += f" (default: {default_text(default, meta['env'])})"
    return text.replace("%", "%%")  # argparse %-formats help strings


def _list_type(kind: type) -> typing.Callable[[str], list[Any]]:
    """One list value: a plain item, or a JSON array of them (vLLM's spelling)."""

    def parse(text: str) -> list[Any]:
        if text.lstrip().startswith("["):
            return [kind(item) for item in _json(text, list, "list")]
        return [kind(text)]

    return parse


def _add_positional(parser: argparse.ArgumentParser, name: str, kind: type, help_text: str) -> None:
    parser.add_argument(name, nargs="?", type=kind, default=None, help=f"{help_text} (or {_flag(name)})")
    parser.add_argument(
        _flag(name),
        dest=name + _FLAG_SUFFIX,
        type=kind,
        default=None,
        metavar=name.upper(),
        help=f"{help_text}, instead of the positional {name.upper()} (vLLM's spelling) "
        "(default: none; one of the two is required)",
    )


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: typing.Collection[str] = ()) -> None:
    """One flag (or positional argument) per field of the settings dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        meta = f.metadata
        kind, is_list = _unwrap(hints[f.name])
        if meta["positional"]:
            _add_positional(parser, f.name, kind, meta["help"])
            continue
        declared = field_default(f)
        default = os.environ.get(meta["env"], declared) if meta["env"] else declared
        flags = [_flag(f.name), *meta["aliases"]]
        if kind is bool:
            parser.add_argument(
                *flags, action=argparse.BooleanOptionalAction, default=default, help=_help(meta, declared)
            )
            if meta["off_flag"]:
                parser.add_argument(
                    "--" + meta["off_flag"],
                    dest=f.name,
                    action="store_false",
                    default=argparse.SUPPRESS,
                    help=f"vLLM's spelling of --no-{_flag(f.name)[2:]} (default: {default_text(not declared)})",
                )
        elif is_list:
            parser.add_argument(
                *flags,
                type=_list_type(kind),
                default=default,
                nargs="+",
                action=_ExtendList,
                help=_help(meta, declared),
            )
        else:
            choices = None if isinstance(meta["choices"], ChoiceKind) else meta["choices"]
            if kind is dict or typing.get_origin(kind) is dict:
                kind = _json_object
            parser.add_argument(*flags, type=kind, default=default, choices=choices, help=_help(meta, declared))


def _json_object(text: str) -> dict[str, Any]:
    """A dict setting's flag: a JSON object (vLLM's `--speculative-config '{...}'`)."""
    return _json(text, dict, "object")


def _json(text: str, kind: type, what: str) -> Any:
    """`text` parsed as JSON of type `kind` (argparse's error otherwise)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {what} {text!r}: {e}") from e
    if not isinstance(value, kind):
        raise argparse.ArgumentTypeError(f"expected a JSON {what}, got {text!r}")
    return value


class _ExtendList(argparse.Action):
    """`--x a b` and `--x '["a", "b"]'` both give ["a", "b"] (each value parses to a list)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, [item for value in values for item in value])


def _positional_value(name: str, namespace: argparse.Namespace) -> Any:
    """The positional setting, given either way; ValueError if missing or given twice differently."""
    value, flag_value = getattr(namespace, name), getattr(namespace, name + _FLAG_SUFFIX, None)
    if value is not None and flag_value is not None and value != flag_value:
        raise ValueError(
            f"two different values for {name}: {value!r} (positional) and {flag_value!r} ({_flag(name)}); give one"
        )
    value = value if value is not None else flag_value
    if value is None:
        raise ValueError(f"a {name} is required: give it as the first argument or as {_flag(name)}")
    return value


def from_namespace(cls: type[T], namespace: argparse.Namespace) -> T:
    """The settings dataclass from parsed flags (fields the parser did not define keep their defaults)."""
    values = {}
    for f in dataclasses.fields(cls):
        if not hasattr(namespace, f.name):
            continue
        positional = f.metadata.get("positional")
        values[f.name] = _positional_value(f.name, namespace) if positional else getattr(namespace, f.name)
    return cls(**values)


def check_choices(settings: Any) -> None:
    """ValueError for a field given a value outside its `choices` (a tuple, or a registered kind).
    None is a field's "not set"; a non-string (a torch.dtype) is checked where it is resolved."""
    for f in dataclasses.fields(settings):
        choices = f.metadata.get("choices")
        value = getattr(settings, f.name)
        if choices is None or not isinstance(value, str):
            continue
        label = settings.label(f.name, value)
        if isinstance(choices, ChoiceKind):
            choices.validate(value, settings, label, field_default(f))
        elif value not in choices:
            raise ValueError(f"{label} is not supported: choose one of {', '.join(choices)}")


class CliSettings:
    """A settings dataclass whose fields are also command-line flags."""

    def label(self, name: str, value: Any) -> str:
        """How an error message names a setting and its value (the field's name, as `LLM(...)`
        spells it; the server's settings say their flag)."""
        return f"{name} {value!r}"

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser, cls)

    @classmethod
    def from_cli_args(cls: type[T], namespace: argparse.Namespace) -> T:
        return from_namespace(cls, namespace)
