"""Settings declared once as dataclass fields, turned into command-line flags.

A field's metadata carries its help text (and optionally `choices`, `positional`, `env`); its type
and default come from the declaration itself. `add_arguments` derives an argparse flag per field
(`max_num_seqs` -> `--max-num-seqs`, booleans as `--x/--no-x`, lists as `nargs="+"`), and
`from_namespace` builds the dataclass back from the parsed flags, so nothing is declared twice.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def setting(default: Any, help: str, *, choices: typing.Sequence[str] | None = None,
            positional: bool = False, env: str | None = None) -> Any:
    """A dataclass field for one setting: its default, its help text, and how the CLI shows it."""
    metadata = {"help": help, "choices": choices, "positional": positional, "env": env}
    if positional:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether it is a list)."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0], True
    return annotation, False


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: typing.Collection[str] = ()) -> None:
    """One flag (or positional argument) per field of the settings dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        meta = f.metadata
        kind, is_list = _unwrap(hints[f.name])
        if meta["positional"]:
            parser.add_argument(f.name, type=kind, help=meta["help"])
            continue
        default = f.default
        if meta["env"]:
            default = os.environ.get(meta["env"], default)
        shown = f" (default: {default})" if default not in (None, False) and kind is not bool else ""
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=meta["help"])
        else:
            parser.add_argument(flag, type=kind, default=default, choices=meta["choices"],
                                nargs="+" if is_list else None, help=meta["help"] + shown)


def from_namespace(cls: type[T], namespace: argparse.Namespace) -> T:
    """The settings dataclass from parsed flags (fields the parser did not define keep their defaults)."""
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
    return cls(**values)


class CliSettings:
    """A settings dataclass whose fields are also command-line flags."""

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser, cls)

    @classmethod
    def from_cli_args(cls: type[T], namespace: argparse.Namespace) -> T:
        return from_namespace(cls, namespace)
