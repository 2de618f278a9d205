"""GPT samples of one split of one indexed dataset: ``seq + 1`` tokens cut from its documents, in an order that
is a function of the seed alone, with the sample index built from the ``.idx`` and cached next to the data.

    split = parse_split("949,50,1")                          # (0.949, 0.05, 0.001): train, valid, test
    first, end = split_documents(split, data.documents)[0]   # the train split's documents [first, end)
    s = GPTSamples(data, (first, end), seq=1024, seed=0, cache=Path("data/axgrid_cache"), split="train")
    s.build(epochs)                                          # one rank: writes the missing epochs' index
    s.open(epochs)                                           # every rank: maps them
    s.sample(i)                                              # [seq + 1] tokens of sample i (any i < epochs·per_epoch)

Epoch ``e`` (Megatron's GPT recipe, one epoch at a time): the split's documents in the order of a permutation
drawn from ``(seed, e)``, their tokens concatenated, cut every ``seq`` tokens into ``per_epoch = (T - 1) // seq``
samples of ``seq + 1`` tokens (consecutive samples share one token; a sample crosses document boundaries), then
the samples in the order of a second permutation of ``(seed, e)``. Sample ``i`` of the run is sample
``i % per_epoch`` of epoch ``i // per_epoch``: an epoch's index depends on nothing but the dataset, the split, seq,
the seed and ``e``, so a longer run reuses the epochs a shorter one built, and the order never depends on the grid.

The index of epoch ``e`` is three arrays in ``.npy`` files under the cache folder (``<prefix name>.<split>.<key>/``,
the key a hash of the ``.idx``'s size and time, the document range, seq and seed): ``order`` (sequence ids in
epoch order), ``start`` (``[per_epoch, 2]``: position in ``order`` and token offset where each sample starts)
and ``shuffle``. Files are written under temporary names and renamed, so a reader never sees half an epoch.
Permutations are numpy's PCG64 (``default_rng``); a cached index is reused as it is, so numpy's version matters
only when an index is built anew.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
from pathlib import Path
from typing import Optional

import numpy as np

from .indexed import DataError, IndexedTokens

SPLITS = ("train", "valid", "test")
#: the version of the cached index's layout (part of its key)
INDEX_VERSION = 1
#: sample starts located per chunk while an epoch's index is built (bounds the temporaries)
SEARCH_CHUNK = 1 << 18


def parse_split(text: str) -> tuple[float, float, float]:
    """``"949,50,1"`` (or ``"98/1/1"``, or fewer parts: the rest are 0) as fractions for train, valid, test.
    DataError (one line) when the parts are not 1 to 3 numbers >= 0 with a positive sum."""
    parts = [p.strip() for p in re.split(r"[,/]", str(text))]
    fix = "write three weights for train, validation and test, e.g. --split 949,50,1"
    if not 1 <= len(parts) <= 3:
        raise DataError(f"--split {text}: {len(parts)} parts; {fix}")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise DataError(f"--split {text}: {', '.join(repr(p) for p in parts)} are not all numbers; {fix}") from None
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise DataError(f"--split {text}: the parts must be numbers >= 0 that add up to more than 0; {fix}")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    return (values[0] / total, values[1] / total, values[2] / total)


def split_documents(split: tuple[float, float, float], documents: int) -> list[tuple[int, int]]:
    """The document ranges ``[first, end)`` of train, valid and test: boundaries at the rounded cumulative
    fractions of ``documents``."""
    cum = [0.0, split[0], split[0] + split[1], 1.0]
    bounds = [min(documents, int(round(c * documents))) for c in cum]
    bounds[-1] = documents
    return [(bounds[i], max(bounds[i], bounds[i + 1])) for i in range(3)]


def _index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _map_npy(path: Path) -> tuple[np.ndarray, Optional[mmap.mmap]]:
    """A ``.npy`` file as a read-only array on a map of the file (and the map, to release its pages)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(f)
        offset = f.tell()
        count = int(np.prod(shape))
        if count == 0:
            return np.zeros(shape, dtype), None
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(m, dtype, count, offset).reshape(shape), m


def _save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


class GPTSamples:
    """Samples of ``seq + 1`` tokens of documents ``docs = (first, end)`` of ``data`` (see the module docstring).
    Constructing reads only the ``.idx``; :meth:`build` writes the index, :meth:`open` maps it."""

    def __init__(self, data: IndexedTokens, docs: tuple[int, int], seq: int, seed: int, cache: Path,
                 split: str = "train") -> None:
        self.data, self.docs, self.seq, self.seed, self.split = data, docs, seq, seed, split
        self.seq_first = int(data.doc_index[docs[0]]) if data.documents else 0
        self.seq_end = int(data.doc_index[docs[1]]) if data.documents else 0
        self.tokens_per_epoch = int(data.lengths[self.seq_first: self.seq_end].sum(dtype=np.int64))
        self.per_epoch = max((self.tokens_per_epoch - 1) // seq, 0)
        st = data.idx_path.stat()
        key = {"version": INDEX_VERSION, "idx": data.idx_path.name, "idx_bytes": st.st_size,
               "idx_mtime_ns": st.st_mtime_ns, "docs": list(docs), "seq": seq, "seed": seed}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        self.key = key
        self.folder = Path(cache) / f"{Path(data.prefix).name}.{split}.{digest}"
        self._epochs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._maps: list[mmap.mmap] = []

    @property
    def documents(self) -> int:
        return self.docs[1] - self.docs[0]

    def epochs_for(self, samples: int) -> int:
        """Epochs whose index ``samples`` samples need."""
        if samples <= 0:
            return 0
        return -(-samples // self.per_epoch)

    def _files(self, epoch: int) -> list[Path]:
        return [self.folder / f"epoch{epoch:05d}.{name}.npy" for name in ("order", "start", "shuffle")]

    def missing(self, epochs: int) -> list[int]:
        """The epochs among ``[0, epochs)`` whose index is not cached yet."""
        return [e for e in range(epochs) if not all(p.is_file() for p in self._files(e))]

    def build(self, epochs: int) -> list[int]:
        """Write the index of every missing epoch among ``[0, epochs)`` (one rank does this); returns them."""
        todo = self.missing(epochs)
        if not todo:
            return todo
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "key.json"
        if not meta.is_file():
            tmp = meta.with_name(f"key.json.tmp{os.getpid()}")
            tmp.write_text(json.dumps({**self.key, "prefix": self.data.prefix, "split": self.split,
                                       "per_epoch": self.per_epoch}, indent=1))
            os.replace(tmp, meta)
        for e in todo:
            for path, arr in zip(self._files(e), self._epoch_index(e)):
                _save_npy(path, arr)
        self.data.release()
        return todo

    def _epoch_index(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(order [n_seq], start [per_epoch, 2], shuffle [per_epoch])`` of one epoch. Memory: about 4 bytes per
        sample and 20 per document (the sample starts are found a chunk at a time)."""
        d = self.data
        docs = np.arange(self.docs[0], self.docs[1], dtype=_index_dtype(d.documents + 1))
        np.random.default_rng([self.seed, epoch, 0]).shuffle(docs)
        firsts = d.doc_index[docs]
        counts = d.doc_index[docs + 1] - firsts
        del docs
        if counts.size and (counts == 1).all():              # one sequence per document (the usual case)
            order = firsts.astype(_index_dtype(max(d.sequences, 1)))
        else:
            ends = np.cumsum(counts)
            order = np.repeat(firsts - (ends - counts), counts) + np.arange(int(ends[-1]) if ends.size else 0)
            order = order.astype(_index_dtype(max(d.sequences, 1)), copy=False)
        del firsts, counts
        cum = np.zeros(order.size + 1, dtype=np.int64)
        np.cumsum(d.lengths[order], out=cum[1:])
        start = np.empty((self.per_epoch, 2), dtype=_index_dtype(order.size))
        for a in range(0, self.per_epoch, SEARCH_CHUNK):
            starts = np.arange(a, min(a + SEARCH_CHUNK, self.per_epoch), dtype=np.int64) * self.seq
            pos = np.searchsorted(cum, starts, side="right") - 1
            start[a: a + starts.size, 0] = pos
            start[a: a + starts.size, 1] = starts - cum[pos]
        del cum
        shuffle = np.arange(self.per_epoch, dtype=_index_dtype(self.per_epoch))
        np.random.default_rng([self.seed, epoch, 1]).shuffle(shuffle)
        return order, start, shuffle

    def open(self, epochs: int) -> None:
        """Map the index of epochs ``[0, epochs)`` (built by :meth:`build`; DataError when one is missing)."""
        for e in range(len(self._epochs), epochs):
            arrays = []
            for p in self._files(e):
                if not p.is_file():
                    raise DataError(f"{p} is missing: the sample index of {self.data.prefix} ({self.split} split) "
                                    f"was not built, or the cache folder {self.folder.parent} is not shared by "
                                    f"every rank; pass --data-cache a folder all ranks see")
                arr, m = _map_npy(p)
                arrays.append(arr)
                if m is not None:
                    self._maps.append(m)
            self._epochs.append(tuple(arrays))

    @property
    def epochs_open(self) -> int:
        return len(self._epochs)

    def sample(self, i: int, spans: Optional[Sequence[tuple[int, int]]] = None) -> np.ndarray:
        """Sample ``i`` of the run: ``[seq + 1]`` tokens (the dataset's dtype). ``spans``: read only the positions
        ``[a, b)`` of each (a context-parallel rank's chunks), the others 0."""
        epoch, j = divmod(int(i), self.per_epoch)
        if epoch >= len(self._epochs):
            raise IndexError(f"sample {i} is in epoch {epoch} of {self.data.prefix} ({self.split}); the index is open "
                             f"for {len(self._epochs)} epoch(s)")
        order, start, shuffle = self._epochs[epoch]
        q, off = (int(v) for v in start[int(shuffle[j])])
        out = (np.empty if spans is None else np.zeros)(self.seq + 1, dtype=self.data.dtype)
        wanted = ((0, out.size),) if spans is None else spans
        filled = 0
        lengths = self.data.lengths
        while filled < out.size:
            sid = int(order[q])
            take = min(out.size - filled, int(lengths[sid]) - off)
            if take > 0:
                for a, b in wanted:                      # the part of this document's piece inside each span
                    lo, hi = max(a, filled), min(b, filled + take)
                    if lo < hi:
                        out[lo:hi] = self.data.tokens(sid, off + lo - filled, hi - lo)
                filled += take
            q += 1
            off = 0
        return out

    def release(self) -> None:
        """Drop the pages of the index and the data read so far from this process's RSS."""
        for m in self._maps:
            if hasattr(mmap, "MADV_DONTNEED"):
                m.madvise(mmap.MADV_DONTNEED)
        self.data.release()

    def __repr__(self) -> str:
        return (f"GPTSamples({self.data.prefix!r}, {self.split}: documents {self.docs[0]}..{self.docs[1]}, "
                f"{self.tokens_per_epoch} tokens, {self.per_epoch} samples of {self.seq}+1 per epoch)")
