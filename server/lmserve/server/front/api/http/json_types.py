"""JSON as the HTTP front reads and writes it, typed: a recursive alias for any JSON
value, and an object of them (a body parsed by `json.loads` is narrowed to one with isinstance
before anything is read from it)."""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject: TypeAlias = dict[str, JsonValue]
