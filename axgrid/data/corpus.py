"""A preprocessed corpus on the grid: the train and validation batches of a blend of indexed datasets.

    settings = DataSettings(paths=("0.7", "data/a", "0.3", "data/b"), split="949,50,1")
    tokens = split_tokens(settings, "valid", limit=65536)        # [<= limit]: a split's first tokens, no grid
    corpus = Corpus(settings, grid, seq=1024, seed=0, vocab=50304, train_samples=steps * batch,
                    valid_samples=eval_iters * batch)            # collective: every rank calls it
    corpus.seek(start, consumed_samples)                          # after a resume (checkpoint extra)
    inputs, targets = corpus.batch(step, batch, rows)             # [batch, seq]: only ``rows`` are read
    inputs, targets = corpus.valid_batch(i, batch, rows)          # validation batch i (the same every time)
    extra = {"data": corpus.position(steps_done, batch)}         # what a checkpoint stores

Opening, in this order:

1. every rank, before any collective: parse ``--data-path`` and ``--split``; open each ``.idx``/``.bin`` (present,
   well formed, ``.bin`` as long as the index says); find each split's documents and check that the train split
   (and the validation split when evaluation is asked for) holds at least one sample. Any problem is a
   SystemExit with one line, identical on every rank (they read the same files).
2. rank 0 builds what is not cached yet (the sample index of the epochs the run needs, and each dataset's largest
   token id, read once in chunks), while the other ranks wait for its marker file (a line every minute says so);
   the cache folder (``--data-cache``, default ``axgrid_cache/`` next to each dataset) must be seen by every rank.
   Rank 0 first writes a marker there: a folder it cannot write (read-only data) stops every rank at once, in one
   line. The wait is bounded by ``0.8 ×`` the runtime's ``io_timeout_s`` (RuntimeConfig; 30 minutes by default): a
   rank that does not see rank 0's marker by then (the folder not shared, rank 0 gone) stops with one line naming
   the marker, rank 0 and ``--data-cache``, and so, through the agreement that follows, does every other rank.
3. every rank maps the index and checks the largest token id against the model's vocabulary.

Batch ``step`` of ``size`` holds blended train samples ``[base + step·size, base + (step+1)·size)``, ``base`` 0
unless :meth:`seek` moved it (a resumed run whose batch size changed). A rank reads only ``rows``: the sequences
its (d, z) share of the batch trains on (:func:`axgrid.driver.share_rows`); the other rows stay 0; under context
parallelism, of each row only the ``spans`` of its chunks (the tokens it computes and their targets). Every
``RELEASE_EVERY`` (64) samples read, the mapped pages are dropped from the process (:meth:`GPTSamples.release`), so RSS
does not grow with the dataset. The validation set is the first ``valid_samples`` blended samples of the validation split.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..core.grid import Grid
from ..io.parts import agree, raise_on_any_rank
from .blend import Blend, parse_blend
from .indexed import DataError, IndexedTokens
from .samples import SPLITS, GPTSamples, parse_split, split_documents

#: How often a rank waiting for rank 0's index build says so.
WAIT_NOTICE_S = 60.0
#: The share of the runtime's ``io_timeout_s`` a rank waits for rank 0's index before it gives up (less than all of
#: it: rank 0 then waits for the others in an agreement bounded by ``io_timeout_s``, and must hear them first)
WAIT_SHARE = 0.8
#: Samples read between two releases of the mapped pages (each sample maps at most a few 64 KiB fault-around
#: windows, so RSS holds at most a few tens of MiB of them)
RELEASE_EVERY = 64


@dataclass(frozen=True)
class DataSettings:
    """``--data-path`` (words: prefixes, or weight-prefix pairs), ``--split``, ``--data-cache``."""
    paths: tuple[str, ...]
    split: str = "949,50,1"
    cache: Optional[str] = None

    def blend(self) -> list[tuple[Optional[float], str]]:
        return parse_blend(self.paths)

    def fractions(self) -> tuple[float, float, float]:
        return parse_split(self.split)

    def record(self) -> dict[str, Any]:
        """The settings as a run's configuration records them (prefixes absolute)."""
        return {"blend": [[w, os.path.abspath(p)] for w, p in self.blend()], "split": list(self.fractions())}


def split_tokens(settings: DataSettings, split: str, limit: int) -> np.ndarray:
    """The first ``limit`` tokens (or all) of a split's documents in document order, dataset after dataset of the
    blend: ``[n]`` int64. Reads only those tokens; no collective, no index (every rank reads the same).
    DataError (one line) when the files are bad or the split has no tokens."""
    out: list[np.ndarray] = []
    left = limit
    for _, prefix in settings.blend():
        data = IndexedTokens(prefix)
        first, end = split_documents(settings.fractions(), data.documents)[SPLITS.index(split)]
        for sid in data.doc_sequences(first, end) if left > 0 else ():
            take = min(left, int(data.lengths[sid]))
            out.append(data.tokens(sid, 0, take).astype(np.int64))
            left -= take
            if left <= 0:
                break
    if not out or limit - left <= 0:
        raise DataError(f"--split {settings.split}: the {split} split of --data-path {' '.join(settings.paths)} holds "
                        f"no tokens; give it a larger share")
    return np.concatenate(out)


def _stats_path(cache: Path, data: IndexedTokens) -> Path:
    i, b = data.idx_path.stat(), data.bin_path.stat()
    return cache / f"{Path(data.prefix).name}.stats.{i.st_size}-{i.st_mtime_ns}-{b.st_size}-{b.st_mtime_ns}.json"


class Corpus:
    """See the module docstring. Collective: every rank constructs it with the same arguments."""

    def __init__(self, settings: DataSettings, grid: Optional[Grid], seq: int, seed: int, vocab: int,
                 train_samples: int, valid_samples: int = 0) -> None:
        self.settings, self.grid, self.seq, self.seed, self.vocab = settings, grid, seq, seed, vocab
        self.base = 0
        self._unreleased = 0
        self.built_here = False          # this rank wrote (part of) the cached index
        try:
            self._describe(train_samples, valid_samples)
        except DataError as e:
            raise SystemExit(str(e)) from None
        self._build_once()
        try:
            for part, epochs in self._epochs.items():
                part.open(epochs)
            self._check_vocab()
        except DataError as e:
            raise SystemExit(str(e)) from None

    # -- step 1: every rank ------------------------------------------------------------------------------
    def _describe(self, train_samples: int, valid_samples: int) -> None:
        blend = self.settings.blend()
        fractions = self.settings.fractions()
        self.datasets = [IndexedTokens(p) for _, p in blend]
        self.caches = [Path(self.settings.cache) if self.settings.cache else Path(p).resolve().parent / "axgrid_cache"
                       for _, p in blend]
        parts: dict[str, list[GPTSamples]] = {}
        for split, wanted in (("train", train_samples), ("valid", valid_samples)):
            if wanted <= 0 and split != "train":
                continue
            parts[split] = []
            for data, cache in zip(self.datasets, self.caches):
                docs = split_documents(fractions, data.documents)[SPLITS.index(split)]
                s = GPTSamples(data, docs, self.seq, self.seed, cache, split)
                if s.per_epoch < 1:
                    raise DataError(f"--split {self.settings.split}: the {split} split of {data.prefix} is "
                                    f"{s.documents} of {data.documents} documents, {s.tokens_per_epoch} tokens: fewer "
                                    f"than one sample of {self.seq + 1}; give the {split} split a larger share, or "
                                    f"use more data")
                parts[split].append(s)
        weights = [w for w, _ in blend]
        if any(w is None for w in weights):              # prefixes only: each dataset by its train tokens
            weights = [float(s.tokens_per_epoch) for s in parts["train"]]
        self.weights = weights
        self.train = Blend(weights, parts["train"])
        self.valid = Blend(weights, parts["valid"]) if "valid" in parts else None
        self._epochs: dict[GPTSamples, int] = {}
        for blend_, wanted in ((self.train, train_samples), (self.valid, valid_samples)):
            if blend_ is None:
                continue
            for part, n in zip(blend_.parts, blend_.needed(max(wanted, 1))):
                self._epochs[part] = part.epochs_for(n)

    # -- step 2: rank 0 builds, the others wait ------------------------------------------------------------
    def _missing(self) -> bool:
        return any(p.missing(e) for p, e in self._epochs.items()) or \
            any(not _stats_path(c, d).is_file() for d, c in zip(self.datasets, self.caches))

    def _build(self) -> None:
        self.built_here = True
        for part, epochs in self._epochs.items():
            part.build(epochs)
        for data, cache in zip(self.datasets, self.caches):
            path = _stats_path(cache, data)
            if not path.is_file():
                cache.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + f".tmp{os.getpid()}")
                tmp.write_text(json.dumps({"prefix": data.prefix, "max_token": data.max_token(),
                                           "tokens": data.total_tokens, "documents": data.documents}))
                os.replace(tmp, path)

    def _build_once(self) -> None:
        grid = self.grid
        if grid is None or grid.world_size == 1:
            if self._missing():
                self._build()
            return
        rank0 = grid.rank == 0
        cache = self.caches[0]
        nonce, missing, unwritable = 0, 0, 0
        cannot = ""
        if rank0 and self._missing():
            nonce, missing = random.randrange(1, 2**31), 1
            try:            # the marker rank 0 starts with: proves it can write the cache before anyone waits
                cache.mkdir(parents=True, exist_ok=True)
                (cache / f".build-{nonce}").write_text("")
            except OSError as e:
                unwritable, cannot = 1, f"{type(e).__name__}: {e.strerror or e}"
        nonce, missing, unwritable = agree(grid, [nonce, missing, unwritable])
        if unwritable:
            raise SystemExit(f"rank 0 cannot write the sample index to {cache}{' (' + cannot + ')' if cannot else ''}"
                             f": pass --data-cache a folder rank 0 can write and every rank sees")
        marker = cache / f".build-{nonce}"
        err: Optional[BaseException] = None
        if missing:
            if rank0:
                try:
                    self._build()
                except Exception as e:        # every rank leaves with this line (the others read it)
                    msg = f"building the sample index in {cache} failed on rank 0: {type(e).__name__}: {e}"
                    with contextlib.suppress(OSError):
                        Path(str(marker) + ".failed").write_text(msg)
                        marker.unlink()
                    raise SystemExit(msg) from None
                Path(str(marker) + ".done").write_text("")
            else:
                err = self._wait_for(marker, grid.runtime.config.io_timeout_s)
        try:
            for part, epochs in self._epochs.items():
                if err is None and part.missing(epochs):
                    part.open(epochs)        # raises the DataError naming the file
        except DataError as e:
            err = SystemExit(str(e))
        try:
            raise_on_any_rank(grid, err, lambda n: SystemExit(
                f"{n} rank(s) cannot see the sample index in {cache}: pass --data-cache a folder every "
                f"rank shares"))
        finally:
            if missing and rank0:
                for end in ("", ".done"):
                    Path(str(marker) + end).unlink(missing_ok=True)

    def _wait_for(self, marker: Path, limit_s: float) -> Optional[SystemExit]:
        """Wait for rank 0's ``marker.done`` (a line every WAIT_NOTICE_S on rank 1); the error this rank leaves
        with: rank 0's ``.failed`` line, or, after ``WAIT_SHARE`` of ``limit_s`` (the runtime's ``io_timeout_s``,
        so that rank 0, waiting in the next agreement for the others, hears this rank's error before its own
        limit), one line naming the marker, rank 0 and ``--data-cache``."""
        t0 = last = time.monotonic()
        done, failed = Path(str(marker) + ".done"), Path(str(marker) + ".failed")
        delay = 0.01
        while not done.exists():
            if failed.exists():
                raise SystemExit(failed.read_text())
            now = time.monotonic()
            if now - t0 >= WAIT_SHARE * limit_s:
                return SystemExit(f"rank {self.grid.rank}: {done} did not appear in {now - t0:.0f} s: rank 0 writes "
                                  f"it when it has built the sample index, so rank 0 failed or stalled, or this rank "
                                  f"does not see the folder; pass --data-cache a folder every rank shares and rank 0 "
                                  f"can write")
            if now - last >= WAIT_NOTICE_S:
                last = now
                if self.grid.rank == 1:
                    print(f"rank 1: waiting {now - t0:.0f} s for rank 0 to build the sample index in "
                          f"{self.caches[0]} (its marker {done.name} must appear; the folder must be shared by "
                          f"every rank)", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        return None

    # -- step 3 ---------------------------------------------------------------------------------------------
    def _check_vocab(self) -> None:
        for data, cache in zip(self.datasets, self.caches):
            path = _stats_path(cache, data)
            try:
                top = int(json.loads(path.read_text())["max_token"])
            except (OSError, ValueError, KeyError) as e:
                raise DataError(f"{path}: unreadable ({e}); delete it and start again") from None
            if top >= self.vocab:
                raise DataError(f"{data.prefix}: token id {top} >= the model's vocabulary {self.vocab}: the data was "
                                f"preprocessed with another tokenizer; preprocess it with the model's tokenizer or "
                                f"use a model with a vocabulary > {top}")

    # -- batches --------------------------------------------------------------------------------------------
    def seek(self, step: int, consumed_samples: int, size: int) -> None:
        """After a resume at ``step`` with ``consumed_samples`` train samples used: batch ``step`` starts there."""
        self.base = int(consumed_samples) - step * size

    def position(self, steps_done: int, size: int) -> dict[str, int]:
        """What a checkpoint after ``steps_done`` steps stores: ``{"consumed_samples": n}``."""
        return {"consumed_samples": self.base + steps_done * size}

    def _rows(self, blend: Blend, first: int, size: int, rows: Optional[Sequence[int]],
              spans: Optional[Sequence[tuple[int, int]]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        out = np.zeros((size, self.seq + 1), dtype=np.int64)
        todo = range(size) if rows is None else rows
        for r in todo:
            out[r] = blend.sample(first + r, spans)
        self._unreleased += len(todo)
        if self._unreleased >= RELEASE_EVERY:
            self._unreleased = 0
            for part in blend.parts:
                part.release()
        t = torch.from_numpy(out)
        return t[:, :-1], t[:, 1:]

    def batch(self, step: int, size: int, rows: Optional[Sequence[int]] = None,
              spans: Optional[Sequence[tuple[int, int]]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Train batch ``step``: ``(inputs [size, seq], targets [size, seq])`` int64; only ``rows`` are read, and
        of each only the token positions ``[a, b)`` of ``spans`` (of the ``seq + 1`` a sample holds: a
        context-parallel rank's chunks, :func:`axgrid.context_parallel.sample_spans`), the rest 0."""
        return self._rows(self.train, self.base + step * size, size, rows, spans)

    def valid_batch(self, i: int, size: int, rows: Optional[Sequence[int]] = None,
                    spans: Optional[Sequence[tuple[int, int]]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Validation batch ``i`` (samples ``[i·size, (i+1)·size)`` of the validation split's blend)."""
        if self.valid is None:
            raise ValueError("this corpus was opened with valid_samples=0")
        return self._rows(self.valid, i * size, size, rows, spans)

    def describe(self) -> str:
        parts = ", ".join(f"{w / sum(self.weights):.3g} x {d.prefix} ({d.documents:,} docs, {d.total_tokens:,} "
                          f"tokens, {d.dtype})" for w, d in zip(self.weights, self.datasets))
        return f"{parts}; split {self.settings.split}"
