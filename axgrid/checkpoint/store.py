"""Checkpoint directories: listing, the ``latest`` pointer, reading and verifying the manifest."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

from .format import _STEP_DIR, FORMAT, LATEST, MANIFEST, VERSION, CheckpointError, _sha256_file

def _alternatives(ckdir: str) -> str:
    """A hint naming the other complete checkpoints next to ``ckdir``."""
    root = os.path.dirname(os.path.abspath(ckdir))
    others = [p for p in list_checkpoints(root) if os.path.abspath(p) != os.path.abspath(ckdir)]
    if not others:
        return "no other complete checkpoint exists under " + root + "; start the run fresh"
    return "load an earlier complete checkpoint instead, e.g. " + others[-1]

def list_checkpoints(root: str) -> list[str]:
    """Complete checkpoints (directories ``step-N`` with a manifest) under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(root, name, MANIFEST)):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str) -> Optional[str]:
    """The checkpoint ``root/latest`` points to (or the newest complete one when the pointer is missing);
    None when there is none. Does not verify the files (loading does)."""
    pointer = os.path.join(root, LATEST)
    if os.path.isfile(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        path = os.path.join(root, name)
        if name and os.path.isfile(os.path.join(path, MANIFEST)):
            return path
    done = list_checkpoints(root)
    return done[-1] if done else None


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory from ``path``: a checkpoint directory itself, or a root with a ``latest`` pointer."""
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint at {path}: the directory does not exist")
    names = os.listdir(path)
    if _STEP_DIR.match(os.path.basename(os.path.normpath(path))) or any(n.startswith("rank-") for n in names):
        raise CheckpointError(f"{os.path.join(path, MANIFEST)} is missing: the checkpoint {path} is incomplete "
                              f"(its save was interrupted or it was damaged); {_alternatives(path)}")
    pointer = os.path.join(path, LATEST)
    if os.path.isfile(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        target = os.path.join(path, name)
        if os.path.isfile(os.path.join(target, MANIFEST)):
            return target
        raise CheckpointError(f"{pointer} names {name!r}, which has no {MANIFEST}: the checkpoint is missing or "
                              f"incomplete; {_alternatives(target)}")
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"no checkpoint found under {path} (no {LATEST} pointer, no complete step-N "
                              f"directory); save one first or start the run fresh")
    return found


def _read_manifest(ckdir: str) -> dict[str, Any]:
    mpath = os.path.join(ckdir, MANIFEST)
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
    return man


def _check_files(ckdir: str, man: Mapping[str, Any]) -> None:
    """Every file of the manifest exists with its recorded size (cheap; the same answer on every rank)."""
    for fname, meta in man["files"].items():
        path = os.path.join(ckdir, fname)
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
