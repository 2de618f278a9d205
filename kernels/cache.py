"""Persistent JSON cache of GEMM decisions.

File format (``FORMAT`` below)::

    {"format": "axgrid-gemm-cache/1",
     "entries": {"<signature key>": {"m":..,"n":..,"k":..,"dtype":..,"device":..,"role":..,
                                     "winner": "torch:NT:AB", "times_s": {"default": .., ...},
                                     "confirm_s": {"default": .., "torch:NT:AB": ..},  # {} if default kept
                                     "rounds": 10, "margin": 0.03, "tuned_at": "...",
                                     "validators": {"device_name":.., "torch":.., "cupy":.., "blas":.., ...}}}}

Location: explicit argument, else ``$AXGRID_GEMM_CACHE``, else ``$XDG_CACHE_HOME/axgrid/gemm.json``,
else ``~/.cache/axgrid/gemm.json``. Writes merge with what is on disk under an ``fcntl.flock`` on a
side ``.lock`` file and land atomically (temp file in the same directory + ``os.replace``), so
concurrent writers never lose or corrupt entries. A corrupt or unreadable file produces exactly one
``GemmCacheWarning`` and is rebuilt on the next write; it never raises.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

from .signature import GemmSignature

try:
    import fcntl
except ImportError:  # non-POSIX: atomic replace still holds, concurrent merges may drop entries
    fcntl = None  # type: ignore[assignment]

FORMAT = "axgrid-gemm-cache/1"
ENV_VAR = "AXGRID_GEMM_CACHE"


class GemmCacheWarning(UserWarning):
    """The GEMM cache file could not be read or written; tuning continues without it."""


def default_cache_path() -> Path:
    """Cache location from the environment (read at call time)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "axgrid" / "gemm.json"


class _Corrupt(Exception):
    pass


def _parse(text: str) -> dict[str, dict]:
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise _Corrupt(f"not an {FORMAT} document")
    entries = data["entries"]
    if not all(isinstance(e, dict) and isinstance(e.get("winner"), str) for e in entries.values()):
        raise _Corrupt("an entry lacks a 'winner'")
    return entries


class GemmCache:
    """Reads and writes the decision file at ``path`` (see module docstring for the default)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self._warned: set[str] = set()

    def _warn_once(self, kind: str, msg: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(msg, GemmCacheWarning, stacklevel=4)

    def load(self) -> dict[str, dict]:
        """All entries on disk; {} when the file is missing, corrupt or unreadable (one warning)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return {}  # missing; an unusable directory is reported once, when writing
        except (OSError, UnicodeDecodeError) as exc:
            self._warn_once("read", f"cannot read GEMM cache {self.path} ({exc}); it will be rebuilt. "
                                    f"Delete it or set {ENV_VAR} to another file to silence this.")
            return {}
        try:
            return _parse(text)
        except (ValueError, _Corrupt) as exc:
            self._warn_once("read", f"GEMM cache {self.path} is corrupt ({exc}); ignoring it, it will be rebuilt. "
                                    f"Delete it or set {ENV_VAR} to another file to silence this.")
            return {}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        with open(self.path.with_name(self.path.name + ".lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _write_atomic(self, entries: dict[str, dict]) -> None:
        text = json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def update(self, new: dict[str, dict]) -> bool:
        """Merge ``new`` entries into the file (lock, re-read, merge, atomic replace).

        Returns False (after one warning) when the file cannot be written; never raises OSError.
        """
        try:
            with self._locked():
                entries = self.load()
                entries.update(new)
                self._write_atomic(entries)
            return True
        except OSError as exc:
            self._warn_once("write", f"cannot write GEMM cache {self.path} ({exc}); decisions are kept in memory "
                                     f"only. Set {ENV_VAR} to a writable file to persist them.")
            return False

    def put(self, sig: GemmSignature, entry: dict) -> bool:
        """Store one decision under ``sig.key``."""
        return self.update({sig.key: entry})
