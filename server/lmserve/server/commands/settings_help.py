"""The settings table of `lmserve serve --help`, generated from the Settings model.

Every field of `lmserve.server.settings.Settings` is listed with its environment variable, its
default, its type and the comment written above it in settings.py, so the help can never
miss a setting or show a stale default. Built only when help is asked for: importing pydantic
would slow down every `lmserve` call.
"""

from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from typing import Any, Literal, get_args, get_origin

_FIELD = re.compile(r"^    (\w+)\s*:")
_COMMENT = re.compile(r"^    #\s?(.*)$")


def field_comments(cls: type) -> dict[str, str]:
    """The `#` comment lines directly above each field of a class body, joined; the class's
    own and its bases' (the settings groups `Settings` is made of)."""
    comments: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if base.__module__ == cls.__module__:
            comments.update(_own_field_comments(base))
    return comments


def _own_field_comments(cls: type) -> dict[str, str]:
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        if match := _COMMENT.match(line):
            pending.append(match.group(1).strip())
        elif match := _FIELD.match(line):
            if pending:
                comments[match.group(1)] = " ".join(pending)
            pending = []
        else:
            pending = []
    return comments


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _type(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return re.sub(r"\b(pathlib|typing|pydantic(\.\w+)*)\.", "", text).replace("NoneType", "None")


def settings_help(flags: set[str]) -> str:
    """The table: one entry per setting, its flag when `flags` (of `serve`) has one."""
    from lmserve.server.settings import Settings

    prefix = str(Settings.model_config.get("env_prefix", ""))
    comments = field_comments(Settings)
    lines = [
        "settings (each from its flag, else its environment variable, else the --config YAML",
        "file, whose keys are the names in lower case, else the default):",
    ]
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        head = f"  {prefix}{name.upper()}  (default {_default(field.get_default())}"
        head += f"; {_type(field.annotation)}" + (f"; {flag}" if flag in flags else "") + ")"
        lines.append(head)
        if name in comments:
            lines += textwrap.wrap(comments[name], 88, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6)  # fmt: skip
    return "\n".join(lines) + "\n"


class SettingsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help, then the settings table (built when the full help is printed; a usage
    line for an error has no sections and stays short)."""

    flags: set[str] = set()
    _full_help = False

    def start_section(self, heading: str | None) -> None:
        self._full_help = True
        super().start_section(heading)

    def format_help(self) -> str:
        text = super().format_help()
        return text + "\n" + settings_help(self.flags) if self._full_help else text


def use_settings_help(parser: argparse.ArgumentParser) -> None:
    """Makes `parser`'s --help end with the settings table, naming the flags it has."""
    flags = {
        flag
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
    }

    class Formatter(SettingsHelpFormatter):
        pass

    Formatter.flags = flags
    parser.formatter_class = Formatter
