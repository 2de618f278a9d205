"""What a manifest must hold, and where its file names may point: checked once, right after it is read, so a
damaged or hand-edited manifest gives one error naming the field instead of a KeyError deep in loading."""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping

import torch

from .format import CheckpointError

_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_KINDS = ("param", "buffer", "optim", "optim-scalar")


class _Missing:
    def __repr__(self) -> str:
        return "nothing (the field is missing)"


_MISSING = _Missing()


def inside(folder: str, path: str) -> bool:
    """Whether ``path``, with every symlink resolved, lies inside ``folder`` (also resolved)."""
    base = os.path.realpath(folder)
    return os.path.realpath(path).startswith(base + os.sep)


def check_file_name(name: Any, what: str) -> str:
    """``name`` is a plain file name (no directory part, no ``..``, not absolute); returns it."""
    if not isinstance(name, str) or not _FILE_NAME.match(name) or name in (".", ".."):
        raise CheckpointError(f"{what} is {name!r}, not a plain file name inside the checkpoint folder (absolute "
                              f"paths, '..' and '/' are refused): the manifest is damaged or was edited")
    return name


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _ints(n: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(_is_int(x) for x in v) and (n is None or len(v) == n)


def _of(typ: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, typ)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def check_manifest(man: Mapping[str, Any], mpath: str, hint: Callable[[], str]) -> None:
    """Every field loading reads has the right type; file names stay inside the checkpoint folder.

    Raises :class:`CheckpointError` naming the first bad field (``hint()`` adds what to do instead)."""

    def field(obj: Mapping[str, Any], key: str, where: str, ok: Callable[[Any], bool], want: str,
              optional: bool = False) -> Any:
        v = obj.get(key, _MISSING)
        if (optional and v in (None, _MISSING)) or (v is not _MISSING and ok(v)):
            return None if v is _MISSING else v
        shown = repr(v) if len(repr(v)) <= 80 else repr(v)[:77] + "..."
        raise CheckpointError(f"{mpath}: field {where}{key} must be {want}, found {shown}: the manifest is "
                              f"damaged or was written by another tool; {hint()}")

    field(man, "step", "", _is_int, "an integer >= 0")
    field(man, "world_size", "", lambda v: _is_int(v, 1), "an integer >= 1")
    field(man, "grid", "", _of(str), "a string like '2x2x2x1'")
    field(man, "order", "", _of(str), "a string or null", optional=True)
    field(man, "zero", "", lambda v: v in (0, 1, 2) and not isinstance(v, bool), "0, 1 or 2", optional=True)
    field(man, "extra", "", _of(dict), "an object", optional=True)
    field(man, "config", "", _of(dict), "an object", optional=True)
    field(man, "generators", "", _strs, "a list of names", optional=True)
    files = field(man, "files", "", _of(dict), "an object {file name: {bytes, sha256}}")
    for fname in files:
        check_file_name(fname, f"{mpath}: a file name in field files")
        meta = field(files, fname, "files.", _of(dict), "an object {bytes, sha256}")
        at = f"files[{fname!r}]."
        field(meta, "bytes", at, _is_int, "an integer >= 0")
        field(meta, "sha256", at, lambda v: isinstance(v, str) and bool(_SHA256.match(v)), "64 hex digits")
        field(meta, "rank", at, _is_int, "an integer >= 0", optional=True)
    tensors = field(man, "tensors", "", _of(dict), "an object {tensor name: {dense_shape, dtype, kind, tiles}}")
    for name in tensors:
        info = field(tensors, name, "tensors.", _of(dict), "an object {dense_shape, dtype, kind, tiles}")
        at = f"tensors[{name!r}]."
        dims = len(field(info, "dense_shape", at, _ints(), "a list of integers >= 0"))
        field(info, "dtype", at, lambda v: isinstance(v, str) and isinstance(getattr(torch, v, None), torch.dtype),
              "a torch dtype name like 'float32'")
        field(info, "kind", at, lambda v: v in _KINDS, f"one of {list(_KINDS)}")
        tiles = field(info, "tiles", at, lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
                      "a list of objects {file, key, offsets, shape}")
        for i, tile in enumerate(tiles):
            t_at = f"{at}tiles[{i}]."
            field(tile, "file", t_at, lambda v: isinstance(v, str) and v in files, "a file listed in field files")
            field(tile, "key", t_at, _of(str), "a string")
            field(tile, "offsets", t_at, _ints(dims), f"a list of {dims} integers >= 0")
            field(tile, "shape", t_at, _ints(dims), f"a list of {dims} integers >= 0")
    opt = field(man, "optimizer", "", _of(dict), "an object or null", optional=True)
    if opt is not None:
        field(opt, "class", "optimizer.", _of(str), "a class name")
        field(opt, "param_groups", "optimizer.", lambda v: isinstance(v, list) and all(
            isinstance(g, dict) and _strs(g.get("params")) for g in v), "a list of {params: [names], ...}")
        field(opt, "values", "optimizer.", _of(dict), "an object")
        field(opt, "state_keys", "optimizer.", lambda v: isinstance(v, dict) and all(_strs(x) for x in v.values()),
              "an object {parameter name: [state key, ...]}")
