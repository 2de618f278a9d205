"""Write a safetensors file one tensor at a time.

Why not ``safetensors.torch.save_file``: it takes the whole ``{name: tensor}`` dict of a file, so every tensor of
a shard (up to ``max_shard_size``: 50 GB by default in Hugging Face) would be in memory at once. A streaming export
has one dense tensor at a time, so it writes the same format itself, which is small and fixed: an 8-byte
little-endian header length N, then N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}`` (space-padded to a multiple of 8), then the tensors' raw little-endian bytes back
to back, in header order, with no gaps. The names, dense shapes and dtypes are known before any data, so the
header is written first. The tests read the files back with ``safetensors.safe_open`` and Hugging Face's
``from_pretrained``.

    with SafetensorsWriter(path, [(name, dtype, shape), ...], metadata={"format": "pt"}) as w:
        for name, tensor in ...:          # in the order given
            w.write(name, tensor)         # or in slabs of rows: w.write_rows(name, first_row, rows)

The file appears under ``path`` only when every tensor was written (it is written as ``path.tmp`` and renamed);
a failure removes the temporary file.
"""
from __future__ import annotations

import json
import math
import os
import struct
import sys
from typing import Optional, Sequence

import torch

#: torch dtype -> safetensors dtype name (the format's own names).
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}


class SafetensorsWriter:
    """A safetensors file written tensor by tensor; ``layout``: ``(name, dtype, shape)`` in writing order."""

    def __init__(self, path: str, layout: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                 metadata: Optional[dict[str, str]] = None) -> None:
        if sys.byteorder != "little":
            raise RuntimeError("SafetensorsWriter writes the machine's bytes: it needs a little-endian host")
        header: dict = {"__metadata__": dict(metadata)} if metadata else {}
        self._todo: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        begin = 0
        for name, dtype, shape in layout:
            if dtype not in DTYPES:
                raise ValueError(f"{name}: dtype {dtype} has no safetensors name; cast it to one of "
                                 f"{sorted(str(d) for d in DTYPES)}")
            if name in header:
                raise ValueError(f"{name} appears twice in one safetensors file")
            end = begin + math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [begin, end]}
            self._todo.append((name, dtype, tuple(shape)))
            begin = end
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.path, self._tmp = path, path + ".tmp"
        self._f = open(self._tmp, "wb")
        self._f.write(struct.pack("<Q", len(text)) + text)
        self._next = self._row = 0          # the tensor being written, and its rows written so far

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append ``tensor`` (any device; copied to the host only if it is not there) as ``name``, which must be
        the next name of the layout with its dtype and shape."""
        want, dtype, shape = self._expected(name)
        if name != want or tensor.dtype != dtype or tuple(tensor.shape) != shape or self._row:
            at = f" from row {self._row}" if self._row else ""
            raise ValueError(f"{self.path}: expected {want} {dtype} {list(shape)}{at} next, got {name} "
                             f"{tensor.dtype} {list(tensor.shape)}")
        self.write_rows(name, 0, tensor)

    def write_rows(self, name: str, start: int, rows: torch.Tensor) -> None:
        """Append the dense rows ``[start, start + len(rows))`` (dim 0) of ``name``: a tensor may come in slabs,
        in order from row 0, and must be complete before the next name (a 0-d tensor: whole, ``start`` 0)."""
        want, dtype, shape = self._expected(name)
        n, total = (rows.shape[0] if rows.dim() else 1), (shape[0] if shape else 1)
        fits = (rows.dim() == 0) == (len(shape) == 0) and tuple(rows.shape[1:]) == shape[1:] and self._row + n <= total
        if name != want or rows.dtype != dtype or start != self._row or not fits:
            raise ValueError(f"{self.path}: expected {want} {dtype} {list(shape)} from row {self._row} next, got "
                             f"{name} {rows.dtype} {list(rows.shape)} from row {start}")
        flat = rows.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():
            self._f.write(flat.view(torch.uint8).numpy().data)    # the tensor's own bytes, no copy on the host
        self._row += n
        if self._row == total:
            self._next, self._row = self._next + 1, 0

    def _expected(self, name: str) -> tuple[str, torch.dtype, tuple[int, ...]]:
        if self._next >= len(self._todo):
            raise ValueError(f"{name}: {self.path} already holds every tensor of its layout")
        return self._todo[self._next]

    def close(self) -> None:
        """Finish the file (flushed, fsynced, renamed into place); raises if a tensor of the layout is missing."""
        if self._next != len(self._todo):
            missing = [n for n, _, _ in self._todo[self._next:]]
            self.abort()
            raise ValueError(f"{self.path}: {len(missing)} tensor(s) never written (first: {missing[0]})")
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the unfinished file."""
        if not self._f.closed:
            self._f.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
