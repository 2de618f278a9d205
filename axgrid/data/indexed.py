"""Megatron's indexed dataset: token ids back to back in ``PREFIX.bin``, their layout in ``PREFIX.idx``; written
with bounded memory and read memory-mapped. Torch-free (numpy only).

    with IndexedWriter("corpus", token_dtype(vocab)) as w:     # PREFIX.bin / PREFIX.idx appear at close
        w.add(ids); w.end_document()                           # ids: [n] integers; a document may hold several
    data = IndexedTokens("corpus")                             # checks both files before anything is read
    data.tokens(seq_id, offset, length)                        # [length] of sequence seq_id, a view of the map
    data.release()                                             # drop the pages read so far from this process

The ``.idx`` layout (all little-endian): the magic ``MMIDIDX\\x00\\x00``, a version (uint64 = 1), the token dtype's
code (uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the sequence count S
(uint64), the document-index count D+1 (uint64), then the sequence lengths (int32 [S]), the byte offsets of the
sequences in ``.bin`` (int64 [S]) and the document indices (int64 [D+1]: document d is sequences
``[doc[d], doc[d+1])``, ``doc[0] = 0``). This is the format Megatron-LM and megatron-core read and write
(``--data-impl mmap``); it is written here from that description because megatron-core's own writer keeps every
length in Python lists (memory grows with the corpus) and its package pulls in Megatron's training stack, which
axgrid's runtime does not need. ``tests/unit/test_indexed_megatron.py`` checks both directions against
megatron-core itself.

Reading maps both files; the pages a read touches count in the process's RSS until :meth:`IndexedTokens.release`
drops them (``madvise(MADV_DONTNEED)``: the kernel's page cache keeps them, so a later read is a minor fault).
"""
from __future__ import annotations

import mmap
import os
import struct
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: dtype code of the ``.idx`` header -> numpy dtype (Megatron's codes)
DTYPES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16),
                               4: np.dtype(np.int32), 5: np.dtype(np.int64), 6: np.dtype(np.float64),
                               7: np.dtype(np.float32), 8: np.dtype(np.uint16)}
CODES = {dt: code for code, dt in DTYPES.items()}
HEADER = len(MAGIC) + 8 + 1 + 8 + 8


class DataError(ValueError):
    """A dataset that cannot be used as it is: the message is one line naming the file and the fix."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids ``< vocab_size``: uint8 up to 256, uint16 up to 65,536, else
    int32 (the widest Megatron's GPT loader reads)."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size}: must be >= 1")
    if vocab_size <= 256:
        return np.dtype(np.uint8)
    if vocab_size <= 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def paths(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """``(PREFIX.idx, PREFIX.bin)``."""
    p = str(prefix)
    return Path(p + ".idx"), Path(p + ".bin")


class _Spill:
    """An append-only array of one dtype kept in memory up to ``limit`` entries, then in a temporary file."""

    def __init__(self, dtype: np.dtype, folder: str, limit: int = 1 << 20) -> None:
        self.dtype, self.limit = np.dtype(dtype), limit
        self.buf: list[int] = []
        self.file = tempfile.TemporaryFile(dir=folder)
        self.count = 0

    def append(self, v: int) -> None:
        self.buf.append(v)
        self.count += 1
        if len(self.buf) >= self.limit:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.file.write(np.asarray(self.buf, dtype=self.dtype).tobytes())
            self.buf = []

    def chunks(self, size: int = 1 << 20):
        """The values in order, ``size`` at a time."""
        self.flush()
        self.file.seek(0)
        while True:
            data = self.file.read(size * self.dtype.itemsize)
            if not data:
                return
            yield np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        self.file.close()


class IndexedWriter:
    """Writes ``PREFIX.bin`` and ``PREFIX.idx``; memory stays bounded whatever the corpus (lengths are spilled to
    temporary files next to the output). The files appear at :meth:`close` (written under ``.tmp`` names and
    renamed); :meth:`abort` (or an exception inside ``with``) leaves no output."""

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODES:
            raise ValueError(f"dtype {self.dtype} has no code in the .idx format; use one of "
                             f"{sorted(str(d) for d in CODES)}")
        self.idx_path, self.bin_path = paths(prefix)
        folder = str(self.idx_path.parent)
        os.makedirs(folder, exist_ok=True)
        self._bin = open(str(self.bin_path) + ".tmp", "wb")
        self._lengths = _Spill(np.int32, folder)
        self._docs = _Spill(np.int64, folder)
        self._docs.append(0)
        self._doc_end = 0                # sequences in finished documents
        self._open = 0                   # tokens of the sequence being written (add_part)
        self.tokens = 0

    def add_part(self, ids: np.ndarray) -> None:
        """Append ``ids`` to the current sequence (a sequence written in parts; :meth:`end_sequence` ends it)."""
        arr = np.asarray(ids)
        if arr.size and (arr.min() < 0 or int(arr.max()) > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids in [{int(arr.min())}, {int(arr.max())}] do not fit {self.dtype}")
        self._bin.write(arr.astype(self.dtype, copy=False).tobytes())
        self._open += arr.size
        self.tokens += arr.size

    def end_sequence(self) -> None:
        if self._open >= 2**31:
            raise ValueError(f"a sequence of {self._open} tokens does not fit the format's int32 lengths")
        self._lengths.append(self._open)
        self._open = 0

    def add(self, ids: np.ndarray) -> None:
        """One whole sequence."""
        self.add_part(ids)
        self.end_sequence()

    def end_document(self) -> None:
        """The sequences since the previous call form one document."""
        self._docs.append(self._lengths.count)
        self._doc_end = self._lengths.count

    def close(self) -> None:
        """Write the index and put both files in place."""
        if self._open:
            self.end_sequence()
        if self._lengths.count > self._doc_end:
            self.end_document()
        self._bin.close()
        tmp_idx = str(self.idx_path) + ".tmp"
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", CODES[self.dtype]))
            f.write(struct.pack("<Q", self._lengths.count) + struct.pack("<Q", self._docs.count))
            for chunk in self._lengths.chunks():
                f.write(chunk.tobytes())
            start = 0
            for chunk in self._lengths.chunks():
                ends = np.cumsum(chunk, dtype=np.int64) * self.dtype.itemsize + start
                f.write((ends - chunk.astype(np.int64) * self.dtype.itemsize).tobytes())
                start = int(ends[-1])
            for chunk in self._docs.chunks():
                f.write(chunk.tobytes())
        os.replace(str(self.bin_path) + ".tmp", self.bin_path)
        os.replace(tmp_idx, self.idx_path)
        self._release()

    def abort(self) -> None:
        """Remove what was written."""
        self._bin.close()
        for p in (str(self.bin_path) + ".tmp", str(self.idx_path) + ".tmp"):
            if os.path.exists(p):
                os.remove(p)
        self._release()

    def _release(self) -> None:
        self._lengths.close()
        self._docs.close()

    def __enter__(self) -> "IndexedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _map(path: Path) -> Optional[mmap.mmap]:
    if path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class IndexedTokens:
    """A ``PREFIX.idx``/``PREFIX.bin`` pair, memory-mapped. Opening checks the files (present, the header, the
    index's own size, ``.bin`` at least as long as the index says) and raises :class:`DataError` with one line.

    ``lengths [S]`` int32, ``pointers [S]`` int64 (byte offsets), ``doc_index [D+1]`` int64 are views of the
    mapped ``.idx``; ``dtype`` is the token dtype."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = str(prefix)
        self.idx_path, self.bin_path = paths(prefix)
        for p in (self.idx_path, self.bin_path):
            if not p.is_file():
                raise DataError(f"{p} does not exist: pass the prefix of a .idx/.bin pair written by "
                                f"'python -m axgrid.data preprocess' or Megatron's preprocess_data.py")
        size = self.idx_path.stat().st_size
        with open(self.idx_path, "rb") as f:
            head = f.read(HEADER)
        if len(head) < HEADER or head[: len(MAGIC)] != MAGIC:
            raise DataError(f"{self.idx_path} is not a Megatron indexed-dataset index (no MMIDIDX header): "
                            f"rewrite it with 'python -m axgrid.data preprocess'")
        version, = struct.unpack("<Q", head[9:17])
        code = head[17]
        if version != VERSION or code not in DTYPES:
            raise DataError(f"{self.idx_path}: version {version}, dtype code {code}: only version 1 with codes "
                            f"{sorted(DTYPES)} is known; rewrite it with 'python -m axgrid.data preprocess'")
        self.dtype = DTYPES[code]
        self.sequences, docs = struct.unpack("<QQ", head[18:34])
        need = HEADER + self.sequences * 12 + docs * 8
        if size < need:
            raise DataError(f"{self.idx_path} is {size} bytes, shorter than the {need} its header promises "
                            f"({self.sequences} sequences, {docs - 1} documents): the file is truncated; "
                            f"preprocess the corpus again")
        self._idx = _map(self.idx_path)
        buf = memoryview(self._idx)
        self.lengths = np.frombuffer(buf, np.int32, self.sequences, HEADER)
        self.pointers = np.frombuffer(buf, np.int64, self.sequences, HEADER + 4 * self.sequences)
        self.doc_index = np.frombuffer(buf, np.int64, docs, HEADER + 12 * self.sequences)
        self.documents = max(int(docs) - 1, 0)
        self.bin_bytes = int(self.pointers[-1]) + int(self.lengths[-1]) * self.dtype.itemsize \
            if self.sequences else 0
        have = self.bin_path.stat().st_size
        if have < self.bin_bytes:
            raise DataError(f"{self.bin_path} is {have} bytes but {self.idx_path} says its tokens end at byte "
                            f"{self.bin_bytes}: the .bin is truncated or belongs to another index; preprocess the "
                            f"corpus again")
        self._bin = _map(self.bin_path)

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    def doc_sequences(self, first_doc: int, end_doc: int) -> range:
        """The sequence ids of documents ``[first_doc, end_doc)``, in order."""
        if not self.documents:
            return range(0)
        return range(int(self.doc_index[first_doc]), int(self.doc_index[end_doc]))

    def tokens(self, seq: int, offset: int = 0, length: Optional[int] = None) -> np.ndarray:
        """``[length]`` tokens of sequence ``seq`` from ``offset`` (to its end by default): a view of the map."""
        n = int(self.lengths[seq]) - offset if length is None else length
        if self._bin is None or n <= 0:
            return np.zeros(0, self.dtype)
        return np.frombuffer(self._bin, self.dtype, n, int(self.pointers[seq]) + offset * self.dtype.itemsize)

    def max_token(self, chunk_bytes: int = 16 << 20) -> int:
        """The largest token id in ``.bin`` (-1 when empty), read in chunks (no map, bounded memory)."""
        best = -1
        step = chunk_bytes - chunk_bytes % self.dtype.itemsize
        left = self.bin_bytes
        with open(self.bin_path, "rb", buffering=0) as f:
            buf = bytearray(step)
            while left > 0:
                n = f.readinto(memoryview(buf)[: min(step, left)])
                if not n:
                    break
                left -= n
                arr = np.frombuffer(buf, self.dtype, n // self.dtype.itemsize)
                if arr.size:
                    best = max(best, int(arr.max()))
        return best

    def release(self) -> None:
        """Drop the mapped pages read so far from this process (RSS); the data stays readable."""
        for m in (self._idx, self._bin):
            if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                m.madvise(mmap.MADV_DONTNEED)

    def __len__(self) -> int:
        return int(self.sequences)

    def __repr__(self) -> str:
        return (f"IndexedTokens({self.prefix!r}: {self.sequences} sequences, {self.documents} documents, "
                f"{self.dtype})")
