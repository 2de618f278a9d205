"""The run's config in a checkpoint: saved with it, compared on resume, so a run with other heads, seed, data or
schedule does not silently continue from weights that were trained for something else.

A config is any JSON-like mapping (nested mappings allowed: ``{"model": {"heads": 8}, "seed": 0}``); its fields
are compared by dotted name (``model.heads``). The grid is not part of it: loading reshards to any grid.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Optional

from .format import CheckpointError, _json_safe


class ConfigMismatch(CheckpointError):
    """The checkpoint was saved by a run with another config; ``fields`` maps each differing field to
    ``(saved, current)`` (``None`` when a side lacks the field)."""

    def __init__(self, message: str, fields: Mapping[str, tuple[Any, Any]]) -> None:
        super().__init__(message)
        self.fields = dict(fields)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"heads": 8}}`` -> ``{"model.heads": 8}`` (JSON-safe values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = _json_safe(value)
            if not isinstance(value, str) and _ADDRESS.search(str(out[name])):     # a repr() of an object
                raise CheckpointError(f"config field {name} is {out[name]}: its text holds a memory address, which "
                                      f"differs in every process, so every resume would report it changed; record "
                                      f"a name or number for it instead")
    return out


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (a JSON round trip keeps NaN, but NaN != NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def config_record(config: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """What the manifest stores for ``config`` (flat, JSON-safe); checks it is a mapping."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise CheckpointError(f"config= must be a mapping of run settings, got {type(config).__name__}")
    return flatten(config)


def _allowed(field: str, allow: Iterable[str]) -> bool:
    return any(field == a or field.startswith(a + ".") for a in allow)


def compare_config(saved: Optional[Mapping[str, Any]], current: Optional[Mapping[str, Any]],
                   allow_changes: Iterable[str], where: str) -> Optional[str]:
    """Raise :class:`ConfigMismatch` naming every differing field not in ``allow_changes`` (a field name, or a
    prefix such as ``model`` for all ``model.*``). Returns a warning text when the checkpoint records no config
    (written before configs were saved), else None."""
    if current is None:
        return None
    if saved is None:
        return (f"the checkpoint {where} records no run config (an older save): its heads, seed, data and schedule "
                f"cannot be compared with this run's")
    mine = config_record(current) or {}
    allow = list(allow_changes)
    diff = {f: (saved.get(f), mine.get(f)) for f in sorted(set(saved) | set(mine))
            if not _same(saved.get(f, _ABSENT), mine.get(f, _ABSENT)) and not _allowed(f, allow)}
    if diff:
        shown = ", ".join(f"{f} {_show(s, f in saved)} -> {_show(c, f in mine)}" for f, (s, c) in diff.items())
        raise ConfigMismatch(f"the checkpoint {where} was saved by a run with another config: {shown} (checkpoint "
                             f"-> this run); resume with the checkpoint's settings, or accept a deliberate change "
                             f"with allow_changes={list(diff)}", diff)
    return None


_ABSENT = object()


def _show(value: Any, present: bool) -> str:
    return repr(value) if present else "(not set)"
