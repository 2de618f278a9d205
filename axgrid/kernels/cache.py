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
concurrent writers never lose or corrupt entries; the file's mode is 0666 minus the umask (0644 by default).
A corrupt or unreadable file produces exactly one ``GemmCacheWarning`` and is rebuilt on the next write; an
unusable entry (no valid ``winner``, wrong types) is ignored with one warning naming it and dropped on the
next write, the other entries are kept. It never raises.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import warnings
from pathlib import Path
from typing import Iterator

from .candidates import Candidate
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


def entry_problem(entry: object) -> str | None:
    """Why a cache entry cannot be used (None when it can): the tuner needs a valid ``winner``; sizes, times
    and validators, when present, must have the right types. Descriptive fields may be missing."""
    if not isinstance(entry, dict):
        return f"not an object but {type(entry).__name__}"
    winner = entry.get("winner")
    if not isinstance(winner, str):
        return "no 'winner'" if winner is None else f"'winner' is {winner!r}, not a candidate name"
    try:
        Candidate.parse(winner)
    except ValueError:
        return f"'winner' {winner!r} is not a candidate name"
    for size in ("m", "n", "k"):
        v = entry.get(size)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return f"{size!r} is {v!r}, not a positive integer"
    for times in ("times_s", "confirm_s"):
        v = entry.get(times)
        if v is not None and not (isinstance(v, dict) and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                                              for t in v.values())):
            return f"{times!r} is not an object of seconds"
    v = entry.get("validators")
    if v is not None and not isinstance(v, dict):
        return "'validators' is not an object"
    return None


def _parse(text: str) -> tuple[dict[str, dict], dict[str, str]]:
    """(usable entries, {bad key: why}) of a cache document; raises _Corrupt when it is not one at all."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise _Corrupt(f"not an {FORMAT} document")
    good, bad = {}, {}
    for key, entry in data["entries"].items():
        why = entry_problem(entry)
        if why is None:
            good[key] = entry
        else:
            bad[key] = why
    return good, bad


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
            entries, bad = _parse(text)
        except (ValueError, _Corrupt) as exc:
            self._warn_once("read", f"GEMM cache {self.path} is corrupt ({exc}); ignoring it, it will be rebuilt. "
                                    f"Delete it or set {ENV_VAR} to another file to silence this.")
            return {}
        if bad:
            shown = "; ".join(f"{k!r}: {why}" for k, why in sorted(bad.items())[:5])
            more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
            self._warn_once("entries:" + ",".join(sorted(bad)),
                            f"GEMM cache {self.path}: ignoring {len(bad)} corrupt entr{'y' if len(bad) == 1 else 'ies'} "
                            f"({shown}{more}); the next write drops {'it' if len(bad) == 1 else 'them'} and keeps "
                            f"the other {len(entries)}")
        return entries

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
        """Write via a temporary file in the same folder and ``os.replace``. The file is created with mode 0666
        minus the umask (0644 under the usual 022, 0664 under 002), so a group-shared cache stays readable."""
        text = json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True)
        tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)     # the kernel applies the umask
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
