"""A Hugging Face checkpoint folder, read tensor box by tensor box through ``safetensors``.

``save_pretrained`` writes ``config.json`` and either ``model.safetensors`` or shards named by
``model.safetensors.index.json`` (``{"weight_map": {tensor: file}}``). :class:`HFCheckpoint` checks the folder
and every file's header when it opens it (``safe_open`` rejects truncated and corrupt files), then reads any
box of any tensor with ``get_slice`` -- only that box's bytes -- and counts the bytes it read. Every error is a
:class:`PretrainedError` naming the file or tensor and the fix.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import torch

from ..spec.tiles import Box

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

#: safetensors' dtype names -> torch
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


#: Rows of a dense tensor mapped at once when a narrower box is read (see :meth:`HFCheckpoint.read`).
BAND_BYTES = 16 * 2**20


class PretrainedError(ValueError):
    """A checkpoint that cannot be loaded as asked: the message names the file or tensor and what to do."""


class HFCheckpoint:
    """The safetensors files of the checkpoint folder ``path`` (opened once each, on first use)."""

    def __init__(self, path: str, device: str = "cpu") -> None:
        self.path, self.device = path, device
        if not os.path.isdir(path):
            raise PretrainedError(f"{path} is not a directory: pass the folder save_pretrained wrote (with "
                                  f"{CONFIG} and {SINGLE} or {INDEX})")
        if not os.path.isfile(os.path.join(path, CONFIG)):
            raise PretrainedError(f"{path} holds no {CONFIG}: it is not a Hugging Face checkpoint folder; pass the "
                                  f"folder save_pretrained wrote")
        self.handles: dict[str, Any] = {}
        self.bytes_read = 0
        self.files_opened: list[str] = []
        self.weight_map = self._weight_map()

    def _weight_map(self) -> dict[str, str]:
        index = os.path.join(self.path, INDEX)
        if os.path.isfile(index):
            try:
                with open(index) as f:
                    wm = json.load(f)["weight_map"]
                if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                    raise TypeError("weight_map is not an object {tensor: file}")
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise PretrainedError(f"{index} cannot be read ({type(e).__name__}: {e}): it is damaged; re-save "
                                      f"the checkpoint with save_pretrained") from None
            for name, fname in wm.items():
                if os.path.basename(fname) != fname or not os.path.isfile(os.path.join(self.path, fname)):
                    raise PretrainedError(f"{os.path.join(self.path, fname)} is missing (named by {INDEX} for "
                                          f"{name}): copy the complete checkpoint, every shard the index names")
            return dict(wm)
        if os.path.isfile(os.path.join(self.path, SINGLE)):
            return {name: SINGLE for name in self._open(SINGLE).keys()}
        others = sorted(n for n in os.listdir(self.path) if n.endswith((".bin", ".pt", ".pth", ".h5", ".msgpack")))
        raise PretrainedError(f"{self.path} holds no {SINGLE} or {INDEX}"
                              + (f" (only {others[:3]}: re-save it with save_pretrained, which writes safetensors)"
                                 if others else ": pass the folder save_pretrained wrote"))

    def _open(self, fname: str):
        if fname not in self.handles:
            from safetensors import safe_open
            fpath = os.path.join(self.path, fname)
            try:
                self.handles[fname] = safe_open(fpath, framework="pt", device=self.device)
            except Exception as e:  # SafetensorError, OSError: truncated, corrupt or unreadable
                raise PretrainedError(f"{fpath} is not a readable safetensors file ({e}): it is truncated or "
                                      f"corrupt; copy or save it again") from None
            if fname not in self.files_opened:
                self.files_opened.append(fname)
        return self.handles[fname]

    def close(self) -> None:
        """Let go of the open files."""
        self.handles.clear()

    def release(self, name: str) -> None:
        """Unmap the file holding tensor ``name`` (reopened on the next read). ``safe_open`` maps the file, and
        every page a box touches stays in this process's RSS while mapped -- for a column-split tile that is
        each page of the tensor -- so the loader releases the file after each tensor: at most one tensor's pages
        are resident at a time."""
        self.handles.pop(self.weight_map[name], None)

    def files(self) -> list[str]:
        """The weight files, in name order."""
        return sorted(set(self.weight_map.values()))

    def open_all(self) -> None:
        """Open every weight file (checks each header); cheap: no tensor data is read."""
        for fname in self.files():
            self._open(fname)

    def find(self, names: list[str]) -> Optional[str]:
        """The first of ``names`` the checkpoint holds, or None."""
        return next((n for n in names if n in self.weight_map), None)

    def describe(self, name: str) -> tuple[str, tuple[int, ...], str]:
        """``(file, shape, safetensors dtype)`` of tensor ``name``, from its file's header."""
        fname = self.weight_map[name]
        handle = self._open(fname)
        try:
            sl = handle.get_slice(name)
        except Exception:
            raise PretrainedError(f"{os.path.join(self.path, fname)} does not hold {name}, although "
                                  f"{INDEX} says it does: the index and the shards disagree; save the checkpoint "
                                  f"again") from None
        return fname, tuple(sl.get_shape()), sl.get_dtype()

    def read(self, name: str, box: Box) -> torch.Tensor:
        """The ``box`` of tensor ``name`` (only its bytes are read; counted in ``bytes_read``).

        A box narrower than the tensor touches every page of the rows it spans (each page holds other ranks'
        columns too), and a mapped page stays resident: such a box is read in bands of rows of at most
        ``BAND_BYTES`` of the dense tensor, the file unmapped after each, so at most one band is resident."""
        fname = self.weight_map[name]
        if not box.shape:
            got = self._open(fname).get_tensor(name).reshape(())
            self.bytes_read += got.element_size()
            return got
        sl = self._open(fname).get_slice(name)
        dense = tuple(sl.get_shape())
        row_bytes = math.prod(dense[1:]) * torch.empty((), dtype=DTYPES[sl.get_dtype()]).element_size()
        band = max(1, BAND_BYTES // max(row_bytes, 1))
        if box.shape[0] <= band or math.prod(box.shape[1:]) == math.prod(dense[1:]):
            got = sl[box.slices()]                      # whole rows, or a band: read at once
            self.bytes_read += got.numel() * got.element_size()
            return got.reshape(box.shape)
        out = None
        r0, rows = box.offsets[0], box.shape[0]
        for start in range(0, rows, band):
            part = Box((r0 + start, *box.offsets[1:]), (min(band, rows - start), *box.shape[1:]))
            got = self._open(fname).get_slice(name)[part.slices()]
            self.handles.pop(fname, None)               # unmap: the band's pages leave this process
            if out is None:
                out = torch.empty(box.shape, dtype=got.dtype, device=got.device)
            out[start: start + part.shape[0]] = got.reshape(part.shape)
            self.bytes_read += got.numel() * got.element_size()
        return out
