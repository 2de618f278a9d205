"""Checkpoint directories: listing, the ``latest`` pointer, reading and verifying the manifest."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

from .format import _STEP_DIR, FORMAT, LATEST, MANIFEST, VERSION, CheckpointError, _sha256_file
from .manifest import check_manifest, inside

def _alternatives(ckdir: str) -> str:
    """A hint naming the other complete checkpoints next to ``ckdir``."""
    root = os.path.dirname(os.path.abspath(ckdir))
    others = [p for p in list_checkpoints(root) if os.path.abspath(p) != os.path.abspath(ckdir)]
    if not others:
        return "no other complete checkpoint exists under " + root + "; start the run fresh"
    return "load an earlier complete checkpoint instead, e.g. " + others[-1]

def list_checkpoints(root: str) -> list[str]:
    """Complete checkpoints (directories ``step-N`` with a manifest, inside ``root``) under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, MANIFEST)) and inside(root, path):
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def _pointer(root: str) -> Optional[str]:
    """The directory ``root/latest`` names (complete or not), None without a pointer; raises when the pointer
    is not a plain ``step-N`` name inside ``root``."""
    pointer = os.path.join(root, LATEST)
    if not os.path.lexists(pointer):
        return None
    if os.path.islink(pointer) or not os.path.isfile(pointer):
        raise CheckpointError(f"{pointer} is not a plain file (axgrid writes it as one, holding a step-N name): "
                              f"remove it to resume from the newest complete checkpoint")
    try:
        with open(pointer) as f:
            name = f.read(4096).strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{pointer} cannot be read ({e}): remove it to resume from the newest complete "
                              f"checkpoint") from None
    if not _STEP_DIR.match(name):
        raise CheckpointError(f"{pointer} names {name[:80]!r}, not a checkpoint folder of this root (step-N; "
                              f"paths, '..' and absolute names are refused): it is damaged or was edited; "
                              f"remove it to resume from the newest complete checkpoint")
    path = os.path.join(root, name)
    if os.path.lexists(path) and not inside(root, path):
        raise CheckpointError(f"{path} (named by {pointer}) is a link to {os.path.realpath(path)}, outside "
                              f"{root}: checkpoints are only read inside their root; copy the checkpoint into "
                              f"{root} instead")
    return path


def latest_checkpoint(root: str) -> Optional[str]:
    """The checkpoint a resume from ``root`` loads: the one ``root/latest`` names, or the newest complete
    ``step-N`` when there is no pointer; None when there is neither. Raises :class:`CheckpointError` (exactly as
    :func:`load_checkpoint` would) when the pointer names a missing or incomplete checkpoint, or one outside
    ``root``. Does not verify the files (loading does)."""
    target = _pointer(root)
    if target is None:
        done = list_checkpoints(root)
        return done[-1] if done else None
    if not os.path.isfile(os.path.join(target, MANIFEST)):
        raise CheckpointError(f"{os.path.join(root, LATEST)} names {os.path.basename(target)!r}, which has no "
                              f"{MANIFEST}: the checkpoint is missing or incomplete; {_alternatives(target)}")
    return target


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory from ``path``: a checkpoint directory itself, or a root (resolved by
    :func:`latest_checkpoint`)."""
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint at {path}: the directory does not exist")
    names = os.listdir(path)
    if _STEP_DIR.match(os.path.basename(os.path.normpath(path))) or any(n.startswith("rank-") for n in names):
        raise CheckpointError(f"{os.path.join(path, MANIFEST)} is missing: the checkpoint {path} is incomplete "
                              f"(its save was interrupted or it was damaged); {_alternatives(path)}")
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"no checkpoint found under {path} (no {LATEST} pointer, no complete step-N "
                              f"directory); save one first or start the run fresh")
    return found


def _read_manifest(ckdir: str) -> dict[str, Any]:
    mpath = os.path.join(ckdir, MANIFEST)
    if os.path.lexists(mpath) and not inside(ckdir, mpath):
        raise CheckpointError(f"{mpath} is a link to {os.path.realpath(mpath)}, outside the checkpoint folder: "
                              f"refused; {_alternatives(ckdir)}")
    try:
        with open(mpath) as f:
            man = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{mpath} is missing: the checkpoint is incomplete; {_alternatives(ckdir)}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mpath} cannot be read ({e}): the manifest is damaged; "
                              f"{_alternatives(ckdir)}") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise CheckpointError(f"{mpath} is not an axgrid checkpoint manifest (format {man.get('format')!r})"
                              if isinstance(man, dict) else f"{mpath} is not an axgrid checkpoint manifest")
    if man.get("version") != VERSION:
        raise CheckpointError(f"{mpath} has format version {man.get('version')}, this axgrid reads version "
                              f"{VERSION}: load it with the axgrid version that wrote it")
    check_manifest(man, mpath, lambda: _alternatives(ckdir))
    return man


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (a checkpoint directory, or a root resolved as
    :func:`load_checkpoint` resolves it), every field type-checked; no file is hashed (:func:`verify_checkpoint`
    hashes them). What a caller reads before loading, e.g. the ``extra`` a resume expects."""
    return _read_manifest(resolve_checkpoint(path))


def _check_files(ckdir: str, man: Mapping[str, Any]) -> None:
    """Every file of the manifest exists with its recorded size (cheap; the same answer on every rank)."""
    for fname, meta in man["files"].items():
        path = os.path.join(ckdir, fname)
        if os.path.lexists(path) and not inside(ckdir, path):
            raise CheckpointError(f"{path} is a link to {os.path.realpath(path)}, outside the checkpoint folder: "
                                  f"refused (every file of a checkpoint must lie inside it); {_alternatives(ckdir)}")
        try:
            size = os.path.getsize(path)
        except OSError:
            raise CheckpointError(f"{path} is missing (listed in the manifest): the checkpoint is damaged; "
                                  f"{_alternatives(ckdir)}") from None
        if size != meta["bytes"]:
            raise CheckpointError(f"{path} has {size} bytes but the manifest records {meta['bytes']}: the file is "
                                  f"truncated or was overwritten; {_alternatives(ckdir)}")


def verify_checkpoint(path: str) -> dict[str, Any]:
    """Check every file's size and sha256 (no torch.distributed needed); returns the manifest."""
    ckdir = resolve_checkpoint(path)
    man = _read_manifest(ckdir)
    _check_files(ckdir, man)
    for fname, meta in man["files"].items():
        fpath = os.path.join(ckdir, fname)
        if _sha256_file(fpath) != meta["sha256"]:
            raise CheckpointError(f"{fpath}: sha256 differs from the manifest's: the file is corrupt; "
                                  f"{_alternatives(ckdir)}")
    return man
