"""A corpus to Megatron's indexed format: ``python -m axgrid.data preprocess`` (see :mod:`.__main__`).

    report = preprocess(PreprocessSettings(inputs=["a.jsonl.zst"], out="data/corpus", tokenizer="hf_folder",
                                           workers=4, append_eod=True))
    # data/corpus.bin + data/corpus.idx; report.documents, .tokens, .skipped, .seconds

Inputs, by name: ``*.jsonl`` / ``*.json`` (one JSON object per line; its ``json_key`` string is one document),
the same compressed (``.gz``, ``.zst``), and any other file as plain UTF-8 text (the whole file is one document).
The main process reads and decompresses; worker processes (``workers``, spawned) parse the JSON and tokenize
batches of documents with the tokenizer's Rust implementation (``tokenizers``' ``encode_batch``, one thread per
worker); the main process writes the results in input order. At most ``2 * workers`` batches are in flight, a
plain-text file travels in chunks of lines and :class:`~.indexed.IndexedWriter` spills its lengths to disk, so
memory stays bounded whatever the input size.

The tokenizer's identity (name, vocabulary size, SHA-256 of its vocabulary) is written beside them as
``OUT.tokenizer.json`` (:mod:`.tokenizer_record`), which the drivers compare with the model's tokenizer.

Tokenizer: ``bytes`` (UTF-8 bytes are the ids, vocabulary 256, uint8; no end-of-document token) or a Hugging Face
folder (its fast tokenizer; ``len(tokenizer)`` ids, so uint16 below 65,536 and int32 above; ``append_eod`` adds
its ``eos_token_id`` after every document). No special tokens are added otherwise.

A corrupt input (a line that is not JSON, not an object, without ``json_key`` or with a non-string value; text
that is not UTF-8; a compressed stream that ends early) is reported as ``FILE:LINE: reason``: ``on_error="fail"``
stops with that line and leaves no output, ``"skip"`` leaves the line out (the rest of the file after a broken
compressed stream), prints it to stderr and counts it.
"""
from __future__ import annotations

import gzip
import io
import json
import multiprocessing
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, TextIO

import numpy as np

from .indexed import IndexedWriter, token_dtype
from .tokenizer_record import BYTES_RECORD, record_of, write_record

#: Documents per batch sent to a worker, and the most bytes of text in one batch.
BATCH_DOCS = 256
BATCH_BYTES = 1 << 20
#: A plain-text file is sent in chunks of whole lines of about this many bytes.
TEXT_CHUNK = 64 << 10
#: How many corrupt lines are printed before they are only counted.
SHOWN_ERRORS = 20


class PreprocessError(RuntimeError):
    """Preprocessing stopped: one line naming the file, the line and the fix."""


@dataclass(frozen=True)
class PreprocessSettings:
    """What ``python -m axgrid.data preprocess`` is asked to do."""
    inputs: Sequence[str]
    out: str
    tokenizer: str = "bytes"
    json_key: str = "text"
    workers: int = 1
    append_eod: bool = False
    on_error: str = "fail"                      # "fail" | "skip"
    batch_docs: int = BATCH_DOCS

    def check(self) -> None:
        """Problems with the settings, before anything is read: PreprocessError with one line."""
        if not self.inputs:
            raise PreprocessError("--input: give at least one file")
        for p in self.inputs:
            if not os.path.isfile(p):
                raise PreprocessError(f"--input {p} does not exist or is not a file")
        if self.workers < 1:
            raise PreprocessError(f"--workers {self.workers}: use 1 or more worker processes")
        if self.on_error not in ("fail", "skip"):
            raise PreprocessError(f"--on-error {self.on_error}: use fail or skip")
        if self.batch_docs < 1:
            raise PreprocessError(f"batch_docs={self.batch_docs}: must be >= 1")


@dataclass
class PreprocessReport:
    """What was written."""
    out: str
    dtype: str
    vocab_size: int
    documents: int = 0
    tokens: int = 0
    skipped: int = 0
    seconds: float = 0.0
    workers: int = 1
    errors: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        docs_s = self.documents / self.seconds if self.seconds > 0 else 0.0
        return (f"preprocess: {self.documents:,} documents, {self.tokens:,} tokens in {self.seconds:.1f} s "
                f"({docs_s:,.0f} docs/s, {self.tokens_per_s:,.0f} tokens/s, "
                f"{self.tokens_per_s / self.workers:,.0f} tokens/s per worker, {self.workers} worker(s)); "
                f"{self.skipped} corrupt line(s) skipped; wrote {self.out}.bin and {self.out}.idx "
                f"({self.dtype}, vocabulary {self.vocab_size:,}) and {self.out}.tokenizer.json")


# ---------------------------------------------------------------------------------------------------------------
# the tokenizer, as the main process describes it to the workers
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizerSpec:
    """Enough to rebuild the tokenizer in a worker: ``json`` is the fast tokenizer's serialization (None: bytes)."""
    json: Optional[str]
    vocab_size: int
    eod: Optional[int]
    name: str
    record: Optional[dict] = None       # its identity (:mod:`.tokenizer_record`), written beside the corpus


def tokenizer_spec(name: str) -> TokenizerSpec:
    """``bytes`` or a Hugging Face folder's fast tokenizer (PreprocessError when it has none)."""
    if name == "bytes":
        return TokenizerSpec(None, 256, None, "bytes", dict(BYTES_RECORD))
    if not os.path.isdir(name):
        raise PreprocessError(f"--tokenizer {name}: neither 'bytes' nor a folder holding a Hugging Face tokenizer")
    from .tokenizers import TOKENIZER_FILES
    if not any((Path(name) / f).is_file() for f in TOKENIZER_FILES):
        raise PreprocessError(f"--tokenizer {name}: the folder holds none of {', '.join(TOKENIZER_FILES)}")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(name, use_fast=True, local_files_only=True)
    if not getattr(tok, "is_fast", False):
        raise PreprocessError(f"--tokenizer {name}: transformers found no fast (Rust) tokenizer for it; save one "
                              f"with tokenizer.save_pretrained() from a PreTrainedTokenizerFast")
    return TokenizerSpec(tok.backend_tokenizer.to_str(), len(tok), tok.eos_token_id, name,
                         record_of(tok, os.path.abspath(name)))


# ---------------------------------------------------------------------------------------------------------------
# workers
# ---------------------------------------------------------------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(spec: TokenizerSpec, json_key: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"        # one thread per worker process
    _WORKER["key"] = json_key
    _WORKER["tok"] = None
    if spec.json is not None:
        from tokenizers import Tokenizer
        _WORKER["tok"] = Tokenizer.from_str(spec.json)


def _line_of(chunk: bytes, first: int, pos: int) -> tuple[int, int]:
    """The (line, column) of byte ``pos`` of a chunk whose first line is ``first``."""
    before = chunk[:pos]
    return first + before.count(b"\n"), pos - (before.rfind(b"\n") + 1) + 1


def _texts(kind: str, items: list[tuple[int, bytes]], key: str) -> tuple[list[Optional[str]], list[Optional[str]]]:
    """Each item's text (None where it is corrupt) and each item's error (None where it is not)."""
    texts: list[Optional[str]] = []
    errors: list[Optional[str]] = []
    for line, raw in items:
        err: Optional[str] = None
        text: Optional[str] = None
        if kind == "json":
            try:
                obj = json.loads(raw)
            except ValueError as e:                      # JSONDecodeError, UnicodeDecodeError
                err = f"{line}: not a JSON line ({str(e).splitlines()[0][:120]})"
            else:
                if not isinstance(obj, dict):
                    err = f"{line}: a JSON {type(obj).__name__}, not an object with a {key!r} string"
                elif key not in obj:
                    err = f"{line}: no key {key!r} (keys: {', '.join(list(obj)[:6])}); pick one with --json-key"
                elif not isinstance(obj[key], str):
                    err = f"{line}: {key!r} holds a {type(obj[key]).__name__}, not a string"
                else:
                    text = obj[key]
        else:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                at, col = _line_of(raw, line, e.start)
                err = f"{at}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col})"
                good = [ln for ln in raw.splitlines(keepends=True) if _is_utf8(ln)]
                text = b"".join(good).decode("utf-8")     # kept if the caller skips: the bad lines left out
        texts.append(text)
        errors.append(err)
    return texts, errors


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def encode_batch(task: tuple[str, list[tuple[int, bytes]]]) -> tuple[np.ndarray, np.ndarray, list[Optional[str]]]:
    """A worker's job: ``(kind, [(line, raw bytes)])`` -> ``(ids [sum n] int64, lengths [items] int64,
    errors [items])`` (an item with an error has length 0 unless it is a text chunk with its bad lines left out)."""
    kind, items = task
    texts, errors = _texts(kind, items, _WORKER["key"])
    tok = _WORKER["tok"]
    good = [t for t in texts if t is not None]
    if tok is None:
        arrays = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in good]
    else:
        arrays = [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(good, add_special_tokens=False)]
    it = iter(arrays)
    out = [next(it) if t is not None else np.zeros(0, np.int64) for t in texts]
    lengths = np.array([a.size for a in out], dtype=np.int64)
    ids = np.concatenate(out).astype(np.int64, copy=False) if out else np.zeros(0, np.int64)
    return ids, lengths, errors


# ---------------------------------------------------------------------------------------------------------------
# reading the inputs
# ---------------------------------------------------------------------------------------------------------------
def _kind(path: str) -> str:
    name = path.lower()
    for ext in (".gz", ".zst", ".zstd"):
        name = name.removesuffix(ext)
    return "json" if name.endswith((".jsonl", ".json")) else "text"


def open_input(path: str) -> io.BufferedIOBase:
    """The decompressed bytes of ``path`` (``.gz``, ``.zst``/``.zstd``, or as it is)."""
    low = path.lower()
    if low.endswith(".gz"):
        return gzip.open(path, "rb")
    if low.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError:
            raise PreprocessError(f"--input {path}: reading .zst needs the zstandard package; pip install "
                                  f"'axgrid[data]' (or zstandard)") from None
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


@dataclass
class _Task:
    file: str
    kind: str
    items: list[tuple[int, bytes]]
    last: list[bool]                    # per item: ends its document


def _tasks(paths: Sequence[str], batch_docs: int, broken: list[str]) -> Iterator[_Task]:
    """Batches of documents (JSON lines) or text chunks, in input order. A compressed stream that breaks is
    appended to ``broken`` as ``FILE:LINE: reason`` and its file ends there."""
    for path in paths:
        kind = _kind(path)
        items: list[tuple[int, bytes]] = []
        last: list[bool] = []
        size = 0
        line = 0
        chunk: list[bytes] = []
        chunk_line = 1
        chunk_size = 0
        try:
            with open_input(path) as f:
                for line, raw in enumerate(f, 1):
                    if kind == "json":
                        if not raw.strip():
                            continue
                        items.append((line, raw))
                        last.append(True)
                        size += len(raw)
                    else:
                        if not chunk:
                            chunk_line = line
                        chunk.append(raw)
                        size += len(raw)
                        chunk_size += len(raw)
                        if chunk_size >= TEXT_CHUNK:
                            items.append((chunk_line, b"".join(chunk)))
                            last.append(False)
                            chunk, chunk_size = [], 0
                    if len(items) >= batch_docs or size >= BATCH_BYTES:
                        yield _Task(path, kind, items, last)
                        items, last, size = [], [], 0
        except (EOFError, OSError, ValueError) as e:       # gzip/zstd: truncated or corrupt stream
            broken.append(f"{path}:{line + 1}: the compressed stream ends early or is corrupt ({e})")
        except Exception as e:                            # zstandard.ZstdError derives from Exception
            if type(e).__name__ != "ZstdError":
                raise
            broken.append(f"{path}:{line + 1}: the compressed stream ends early or is corrupt ({e})")
        if kind == "text":
            items.append((chunk_line, b"".join(chunk)))
            last.append(True)                             # the file's document ends (possibly empty chunk)
        if items:
            yield _Task(path, kind, items, last)


# ---------------------------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------------------------
class Progress:
    """Documents and tokens per second: a tqdm bar on a terminal (or ``bar=True``), else a line every
    ``every_s`` seconds; ``bar=False, every_s=0``: silent."""

    def __init__(self, stream: TextIO, bar: Optional[bool] = None, every_s: float = 30.0) -> None:
        self.stream, self.every_s = stream, every_s
        self.t0 = self.last = time.perf_counter()
        self.docs = self.tokens = 0
        show = stream.isatty() if bar is None else bar
        self.bar = None
        if show:
            from tqdm import tqdm
            self.bar = tqdm(file=stream, unit=" docs", mininterval=0.5, dynamic_ncols=True)

    def update(self, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        now = time.perf_counter()
        rate = self.tokens / max(now - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rate:,.0f} tokens/s, {self.tokens:,} tokens", refresh=False)
            self.bar.update(docs)
        elif self.every_s and now - self.last >= self.every_s:
            self.last = now
            print(f"preprocess: {self.docs:,} documents ({self.docs / (now - self.t0):,.0f}/s), {self.tokens:,} "
                  f"tokens ({rate:,.0f}/s)", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------------------------
def _results(tasks: Iterator[_Task], pool: Any, window: int) -> Iterator[tuple[_Task, tuple]]:
    """Each task with its worker's result, in order, at most ``window`` in flight."""
    pending: deque = deque()
    for task in tasks:
        pending.append((task, pool.apply_async(encode_batch, ((task.kind, task.items),))))
        if len(pending) >= window:
            t, r = pending.popleft()
            yield t, r.get()
    while pending:
        t, r = pending.popleft()
        yield t, r.get()


def preprocess(s: PreprocessSettings, progress: Optional[Progress] = None,
               stderr: TextIO = sys.stderr) -> PreprocessReport:
    """Write ``s.out + ".bin"/".idx"``; returns the report. PreprocessError (nothing written) on a corrupt line
    under ``on_error="fail"``, or bad settings."""
    s.check()
    spec = tokenizer_spec(s.tokenizer)
    if s.append_eod and spec.eod is None:
        raise PreprocessError(f"--append-eod: tokenizer {spec.name} has no end-of-document (eos) token; leave "
                              f"--append-eod out (document boundaries are kept in the .idx either way)")
    dtype = token_dtype(spec.vocab_size)
    report = PreprocessReport(s.out, str(dtype), spec.vocab_size, workers=s.workers)
    progress = progress or Progress(stderr)
    eod = np.array([spec.eod], dtype=np.int64) if s.append_eod else None
    t0 = time.perf_counter()
    broken: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    writer = IndexedWriter(s.out, dtype)
    try:
        with ctx.Pool(s.workers, initializer=_init_worker, initargs=(spec, s.json_key)) as pool:
            for task, (ids, lengths, errors) in _results(_tasks(s.inputs, s.batch_docs, broken), pool,
                                                        2 * s.workers):
                for msg in broken:
                    _corrupt(s, report, msg, stderr)
                broken.clear()
                start = 0
                docs = 0
                for n, err, ends in zip(lengths.tolist(), errors, task.last):
                    if err is not None:
                        _corrupt(s, report, f"{task.file}:{err}", stderr)
                        if task.kind == "json":
                            continue
                    writer.add_part(ids[start: start + n])
                    start += n
                    if ends:
                        if eod is not None:
                            writer.add_part(eod)
                        writer.end_sequence()
                        writer.end_document()
                        docs += 1
                report.documents += docs
                progress.update(docs, int(lengths.sum()) + (docs if eod is not None else 0))
            for msg in broken:
                _corrupt(s, report, msg, stderr)
    except BaseException:
        writer.abort()
        progress.close()
        raise
    writer.close()
    write_record(s.out, spec.record or record_of(None))
    progress.close()
    report.tokens = writer.tokens
    report.seconds = time.perf_counter() - t0
    return report


def _corrupt(s: PreprocessSettings, report: PreprocessReport, msg: str, stderr: TextIO) -> None:
    if s.on_error == "fail":
        raise PreprocessError(f"{msg}; fix the input, or pass --on-error skip to leave such lines out")
    report.skipped += 1
    if len(report.errors) < SHOWN_ERRORS:
        report.errors.append(msg)
        print(f"preprocess: skipped {msg}", file=stderr, flush=True)
