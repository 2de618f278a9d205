"""Sharded, reshardable, atomic checkpoints of a model and its optimizer.

A checkpoint saved on one grid loads on any other grid (or into the serial model, ``grid=None``) built with
the same sizes: every tensor is written as the rectangular tiles of its *dense* form that the ranks hold
(:class:`axgrid.sharding.TileSpec`), and a loading rank assembles its own tile from the saved tiles that
overlap it, then cuts its part with ``TileSpec.part_of``.

Layout on disk (``root`` is what you pass to :class:`CheckpointManager` / :func:`save_checkpoint`)::

    root/
      latest                    one line: the name of the newest complete checkpoint (replaced atomically)
      step-00000100/
        manifest.json           format, version, step, grid, order, world size, per tensor its dense shape,
                                dtype and tiles (file, key, offsets, shape), per file its size and sha256,
                                optimizer class and hyper-parameters, user ``extra`` (e.g. data position)
        rank-00000.pt           torch.save({"tensors": {key: tile}, "rng": {...}}) of plain tensors/dicts
        rank-00001.pt           ...one per rank (every rank saves its RNG state; tiles only by their writer)

Which rank writes a tile: a parameter's data is a tile of the dense tensor, possibly flattened and split over
``split_dim`` (z). The split tile is all-gathered over z (through ``grid.comm``), and exactly one rank per
distinct tile writes it: the one whose coordinate is 0 along the split dimension and along every letter of
``param.axgrid_replicated``. Dense parameters (no tile) and scalar optimizer state (AdamW's ``step``) are
written once, by rank 0. Optimizer tensors with the parameter's shape (``exp_avg``, ``exp_avg_sq``,
momentum buffers) share the parameter's tile.

Atomicity: all ranks write into ``root/step-XXXXXXXX.tmp-<random>``; after every rank reported success (an
all-reduce of a flag over "xyz" then "d"), rank 0 writes the manifest, renames the directory to its final name
and replaces ``latest`` with ``os.replace``. An interrupted or failed save leaves ``latest`` and the earlier
checkpoints untouched; older checkpoints beyond ``keep`` are removed only after the new one is complete.

Loading reads only the manifest and the files holding overlapping tiles (``torch.load(weights_only=True)``),
checks every file's size on every rank and the sha256 of every file it reads, and posts no collective before
one agreement all-reduce: a damaged or mismatched checkpoint raises :class:`CheckpointError` on every rank,
naming the file and the fix, and leaves the model, the optimizer and the files untouched.

Save-on-signal: :class:`SaveOnSignal` turns SIGTERM / SIGUSR1 (Slurm's ``--signal=USR1@120``) into a flag that
all ranks agree on at a step boundary, so the job saves and exits cleanly before its time limit.

    ckpt = CheckpointManager("ckpt", grid, keep=2)
    info = ckpt.resume(model, opt, generators={"data": gen})       # None on a fresh start
    with SaveOnSignal(grid) as stop:
        for step in range(info.step if info else 0, steps):
            train_step()
            if (step + 1) % 100 == 0 or stop.should_stop():
                ckpt.save(step + 1, model, opt, extra={"tokens_seen": ...}, generators={"data": gen})
                if stop.stopped:
                    break
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch
from torch import nn

from .sharding import TileSpec, tile_of

FORMAT = "axgrid-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_HASH_CHUNK = 16 * 2**20

__all__ = ["CheckpointError", "LoadInfo", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "list_checkpoints", "resolve_checkpoint", "verify_checkpoint", "CheckpointManager", "SaveOnSignal"]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read: the message names the file and what to do."""


@dataclass
class LoadInfo:
    """What :func:`load_checkpoint` restored."""

    path: str                    # the checkpoint directory that was read
    step: int
    extra: dict[str, Any]        # the ``extra`` given to save (data-loader position, scheduler, ...)
    saved_grid: str              # e.g. "2x2x2x1" ("serial" for a checkpoint written without a grid)
    saved_world_size: int
    resharded: bool              # grid, order or world size differ from the saving run
    rng: str                     # "per-rank", "from rank 0" (resharded) or "not restored"
    optimizer: bool              # optimizer state was restored


@dataclass
class _Entry:
    """One tensor to save or load: this rank's data and where it sits in the dense tensor."""

    name: str                         # "model/<state_dict key>" or "optim/<param name>/<state key>"
    tensor: torch.Tensor              # this rank's data: the part when split, else the whole tile
    tile: Optional[TileSpec]          # None: dense, replicated on every rank
    replicated: str                   # grid letters holding identical copies
    kind: str = "param"               # "param", "buffer", "optim" (parameter-shaped) or "optim-scalar"

    @property
    def dense_shape(self) -> tuple[int, ...]:
        return tuple(self.tile.dense_shape) if self.tile else tuple(self.tensor.shape)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(self.tile.offsets) if self.tile else (0,) * self.tensor.dim()

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return tuple(self.tile.tile_shape) if self.tile else tuple(self.tensor.shape)


# ---------------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------------
def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in the manifest")
    return dt


def _json_safe(v: Any) -> Any:
    """A JSON-representable copy of an optimizer hyper-parameter (tensors -> numbers, tuples -> lists)."""
    if torch.is_tensor(v):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _like(saved: Any, current: Any) -> Any:
    """``saved`` (from JSON) in the type of the ``current`` hyper-parameter value."""
    if torch.is_tensor(current):
        return torch.tensor(saved, dtype=current.dtype, device=current.device)
    if isinstance(current, tuple) and isinstance(saved, list):
        return tuple(saved)
    return saved


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def _overlap(a_off: Sequence[int], a_shape: Sequence[int], b_off: Sequence[int],
             b_shape: Sequence[int]) -> Optional[tuple[list[int], list[int]]]:
    """The intersection ``[lo, hi)`` of two boxes, or None when empty (0-d boxes always intersect)."""
    lo = [max(a, b) for a, b in zip(a_off, b_off)]
    hi = [min(a + sa, b + sb) for a, sa, b, sb in zip(a_off, a_shape, b_off, b_shape)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, hi


def _grid_str(grid) -> str:
    return "serial" if grid is None else str(grid.shape)


def _rank_world(grid) -> tuple[int, int]:
    return (0, 1) if grid is None else (grid.rank, grid.world_size)


def _agree(grid, values: Sequence[int]) -> list[int]:
    """Sum of ``values`` (int64) over every rank of the grid: an all-reduce over "xyz" then over "d" (the two
    groups together span the whole grid). Also a barrier. With no grid: the values themselves."""
    t = torch.tensor(list(values), dtype=torch.int64)
    if grid is not None:
        if grid.device.type != "cpu":
            t = t.to(grid.device)
        t = grid.comm.all_reduce(t, "xyz")
        t = grid.comm.all_reduce(t, "d")
    return [int(v) for v in t.cpu().tolist()]


def _fingerprint(entries: Sequence[_Entry]) -> int:
    """24 bits identifying the list of tensors (names, dense shapes, dtypes, split): equal on all ranks of a
    well-formed SPMD model."""
    h = hashlib.sha256()
    for e in entries:
        split = e.tile.split_dim if e.tile else None
        h.update(f"{e.name}|{e.dense_shape}|{_dtype_name(e.tensor.dtype)}|{split}|{e.kind};".encode())
    return int.from_bytes(h.digest()[:3], "little")


def _alternatives(ckdir: str) -> str:
    """A hint naming the other complete checkpoints next to ``ckdir``."""
    root = os.path.dirname(os.path.abspath(ckdir))
    others = [p for p in list_checkpoints(root) if os.path.abspath(p) != os.path.abspath(ckdir)]
    if not others:
        return "no other complete checkpoint exists under " + root + "; start the run fresh"
    return "load an earlier complete checkpoint instead, e.g. " + others[-1]


# ---------------------------------------------------------------------------------------------------------
# what to save: model and optimizer entries
# ---------------------------------------------------------------------------------------------------------
def _model_entries(model: nn.Module) -> list[_Entry]:
    out = []
    params = {id(p) for p in model.parameters()}
    for name, t in model.state_dict(keep_vars=True).items():
        if not torch.is_tensor(t):
            raise CheckpointError(f"model state {name!r} is a {type(t).__name__}, not a tensor; checkpoints hold "
                                  f"tensors only (keep other state in extra=...)")
        tile = tile_of(t)
        rep = getattr(t, "axgrid_replicated", None)
        if rep is None:
            rep = "d" if tile is not None else "xyzd"
        out.append(_Entry("model/" + name, t.detach(), tile, rep, "param" if id(t) in params else "buffer"))
    return out


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _optim_entries(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[list[_Entry], dict[str, Any]]:
    """Entries for the optimizer's tensor state and a JSON description (class, groups, non-tensor values)."""
    names = _param_names(model)
    groups, values, keys = [], {}, {}
    entries: list[_Entry] = []
    for gi, g in enumerate(opt.param_groups):
        pnames = []
        for p in g["params"]:
            if id(p) not in names:
                raise CheckpointError(f"optimizer parameter group {gi} holds a tensor of shape {tuple(p.shape)} "
                                      f"that is not a parameter of the model; checkpoints name optimizer state by "
                                      f"model parameter names, so build the optimizer from model.parameters()")
            pnames.append(names[id(p)])
        groups.append({"params": pnames, **{k: _json_safe(v) for k, v in g.items() if k != "params"}})
        for p, pname in zip(g["params"], pnames):
            st = opt.state.get(p, {})
            for key in sorted(st):
                v = st[key]
                if not torch.is_tensor(v):
                    values.setdefault(pname, {})[key] = _json_safe(v)
                    continue
                name = f"optim/{pname}/{key}"
                if tuple(v.shape) == tuple(p.shape) and key != "step":
                    tile = tile_of(p)
                    rep = getattr(p, "axgrid_replicated", None) or ("d" if tile is not None else "xyzd")
                    entries.append(_Entry(name, v.detach(), tile, rep, "optim"))
                elif v.numel() == 1:
                    entries.append(_Entry(name, v.detach(), None, "xyzd", "optim-scalar"))
                else:
                    raise CheckpointError(f"optimizer state {key!r} of parameter {pname!r} has shape "
                                          f"{tuple(v.shape)}, neither the parameter's shape {tuple(p.shape)} nor a "
                                          f"scalar: this checkpoint format cannot place it on another grid")
                keys.setdefault(pname, []).append(key)
    desc = {"class": type(opt).__name__, "param_groups": groups, "values": values, "state_keys": keys}
    return entries, desc


def _check_entry(e: _Entry, grid) -> None:
    """This rank's data agrees with its TileSpec and the grid."""
    if e.tile is None:
        return
    t = e.tile
    if t.split_dim:
        want: tuple[int, ...] = (t.part_numel,)
        if grid is not None and grid.size(t.split_dim) != t.split_size:
            raise CheckpointError(f"{e.name}: its TileSpec splits over {t.split_dim} in {t.split_size} parts but "
                                  f"the grid has G{t.split_dim}={grid.size(t.split_dim)}")
    else:
        want = tuple(t.tile_shape)
    if tuple(e.tensor.shape) != want:
        raise CheckpointError(f"{e.name}: this rank holds shape {tuple(e.tensor.shape)} but its TileSpec says "
                              f"{want}; the parameter and its axgrid_tile disagree")
    if grid is None and (t.split_size > 1 or tuple(t.tile_shape) != tuple(t.dense_shape)):
        raise CheckpointError(f"{e.name} is a tile of a larger tensor, but no grid was given: pass grid=...")


# ---------------------------------------------------------------------------------------------------------
# RNG state
# ---------------------------------------------------------------------------------------------------------
def _rng_state(generators: Optional[Mapping[str, torch.Generator]]) -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    st: dict[str, Any] = {"torch": torch.get_rng_state(),
                          "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                                     "gauss": gauss},
                          "generators": {k: g.get_state() for k, g in (generators or {}).items()}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        st["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached": float(cached)}
    return st


def _restore_rng(st: Mapping[str, Any], generators: Optional[Mapping[str, torch.Generator]], where: str) -> None:
    torch.set_rng_state(st["torch"])
    py = st["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in st:
        n = st["numpy"]
        np.random.set_state((n["kind"], n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"], n["cached"]))
    saved = st.get("generators", {})
    for k, g in (generators or {}).items():
        if k not in saved:
            raise CheckpointError(f"generator {k!r} is not in the checkpoint ({where}); it holds "
                                  f"{sorted(saved) or 'none'}: pass the same generators= to save and load")
        g.set_state(saved[k])


# ---------------------------------------------------------------------------------------------------------
# listing and resolving
# ---------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------------------
def _is_writer(grid, e: _Entry) -> bool:
    if grid is None:
        return True
    letters = set(e.replicated) & set("xyzd")
    if e.tile is not None and e.tile.split_dim:
        letters.add(e.tile.split_dim)
    return all(grid.coord[c] == 0 for c in letters)


def _whole_tile(grid, e: _Entry) -> torch.Tensor:
    """The entry's whole tile ``tile_shape`` (all-gathered over the split dimension: a collective)."""
    t = e.tensor
    if e.tile is not None and e.tile.split_dim:
        full = grid.comm.all_gather(t.contiguous(), e.tile.split_dim).reshape(-1) if grid is not None else t
        return full[: e.tile.tile_numel].view(e.tile.tile_shape)
    return t.reshape(e.tile_shape)


def save_checkpoint(root: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    grid=None, *, step: int, extra: Optional[Mapping[str, Any]] = None,
                    generators: Optional[Mapping[str, torch.Generator]] = None, keep: Optional[int] = 2) -> str:
    """Save ``model`` (and ``optimizer``) as ``root/step-<step>`` and point ``root/latest`` at it.

    Collective: every rank of ``grid`` must call it with the same arguments (``grid=None``: a serial model in
    one process). ``extra``: JSON-serialisable run state (data position, scheduler, ...) returned by
    :func:`load_checkpoint`. ``generators``: named ``torch.Generator`` whose per-rank states are saved with the
    global torch / python / numpy RNG states. ``keep``: complete checkpoints to keep (None: all). Returns the
    checkpoint directory. Raises :class:`CheckpointError` on every rank when any rank fails; the previous
    checkpoints and ``latest`` are then untouched.
    """
    rank, world = _rank_world(grid)
    final = os.path.join(root, f"step-{int(step):08d}")
    err: Optional[CheckpointError] = None
    entries: list[_Entry] = []
    optim_desc: Optional[dict[str, Any]] = None
    rng: dict[str, Any] = {}
    try:
        entries = _model_entries(model)
        if optimizer is not None:
            oe, optim_desc = _optim_entries(model, optimizer)
            entries += oe
        for e in entries:
            _check_entry(e, grid)
        if extra is not None:
            try:
                json.dumps(extra)
            except (TypeError, ValueError) as ex:
                raise CheckpointError(f"extra= must be JSON-serialisable ({ex})") from None
        rng = _rng_state(generators)
    except CheckpointError as ex:
        err = ex
    fp = _fingerprint(entries)
    token = secrets.randbits(40) if rank == 0 else 0   # not torch's RNG: saving must not change training
    failed, s1, s2, token = _agree(grid, [int(err is not None), fp, fp * fp, token])
    if err is not None:
        raise err
    if failed:
        raise CheckpointError(f"{failed} rank(s) could not start saving {final} (see their errors); nothing "
                              f"was written")
    if s1 != world * fp or s2 != world * fp * fp:
        raise CheckpointError(f"ranks disagree about the tensors to save (names, shapes, dtypes or optimizer "
                              f"state differ between ranks): every rank must build the same model and optimizer")

    tmp = f"{final}.tmp-{token:010x}"
    fname = f"rank-{rank:05d}.pt"
    tensors: dict[str, torch.Tensor] = {}
    tiles: list[dict[str, Any]] = []
    for e in entries:                                   # collectives (z all-gathers) in the same order everywhere
        whole = _whole_tile(grid, e)
        if _is_writer(grid, e):
            tensors[e.name] = whole.detach().to("cpu", copy=True).contiguous()
            tiles.append({"name": e.name, "key": e.name, "offsets": list(e.offsets), "shape": list(e.tile_shape)})
    try:
        os.makedirs(tmp, exist_ok=True)
        buf = io.BytesIO()
        torch.save({"tensors": tensors, "rng": rng}, buf)
        data = buf.getvalue()
        _write_bytes(os.path.join(tmp, fname), data)
        index = {"rank": rank, "file": fname, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                 "tiles": tiles}
        _write_bytes(os.path.join(tmp, f"rank-{rank:05d}.json"), json.dumps(index).encode())
    except OSError as ex:
        err = CheckpointError(f"rank {rank} could not write {os.path.join(tmp, fname)}: {ex}")
    (failed,) = _agree(grid, [int(err is not None)])
    if failed:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise err or CheckpointError(f"{failed} rank(s) failed writing {final} (see their errors); the previous "
                                     f"checkpoints and {os.path.join(root, LATEST)} are untouched")
    if rank == 0:
        try:
            _finish(root, tmp, final, entries, optim_desc, grid, world, int(step), extra, generators, keep, token)
        except (OSError, CheckpointError) as ex:
            shutil.rmtree(tmp, ignore_errors=True)
            err = ex if isinstance(ex, CheckpointError) else CheckpointError(f"finishing {final} failed: {ex}")
    (failed,) = _agree(grid, [int(err is not None)])
    if failed:
        raise err or CheckpointError(f"rank 0 failed to finish {final} (see its error); the previous checkpoints "
                                     f"are untouched")
    return final


def _finish(root: str, tmp: str, final: str, entries: Sequence[_Entry], optim_desc: Optional[dict[str, Any]],
            grid, world: int, step: int, extra: Optional[Mapping[str, Any]],
            generators: Optional[Mapping[str, torch.Generator]], keep: Optional[int], token: int) -> None:
    """Rank 0, after every rank wrote its file: manifest, rename into place, ``latest``, pruning."""
    files: dict[str, Any] = {}
    tiles: dict[str, list[dict[str, Any]]] = {}
    for r in range(world):
        ipath = os.path.join(tmp, f"rank-{r:05d}.json")
        with open(ipath) as f:
            idx = json.load(f)
        files[idx["file"]] = {"bytes": idx["bytes"], "sha256": idx["sha256"], "rank": r}
        for t in idx["tiles"]:
            lst = tiles.setdefault(t["name"], [])
            if not any(o["offsets"] == t["offsets"] and o["shape"] == t["shape"] for o in lst):
                lst.append({"file": idx["file"], "key": t["key"], "offsets": t["offsets"], "shape": t["shape"]})
    tensors: dict[str, Any] = {}
    for e in entries:
        if e.name in tensors:
            continue
        got = tiles.get(e.name, [])
        covered = sum(math.prod(t["shape"]) for t in got)
        if covered != math.prod(e.dense_shape):
            raise CheckpointError(f"{e.name}: the saved tiles cover {covered} of {math.prod(e.dense_shape)} "
                                  f"elements; its parameters' axgrid_replicated / axgrid_tile marks are wrong")
        tensors[e.name] = {"dense_shape": list(e.dense_shape), "dtype": _dtype_name(e.tensor.dtype),
                           "kind": e.kind, "tiles": got}
    man = {"format": FORMAT, "version": VERSION, "step": step, "created": time.time(),
           "torch": torch.__version__, "grid": _grid_str(grid), "order": None if grid is None else grid.order,
           "world_size": world, "tensors": tensors, "optimizer": optim_desc, "files": files,
           "generators": sorted(generators or {}), "extra": dict(extra or {})}
    _write_bytes(os.path.join(tmp, MANIFEST), json.dumps(man, indent=1).encode())
    for r in range(world):
        os.remove(os.path.join(tmp, f"rank-{r:05d}.json"))
    _fsync_dir(tmp)
    if os.path.exists(final):                 # saving the same step again: swap, then drop the old one
        old = f"{final}.old-{token:010x}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    pointer_tmp = os.path.join(root, f"{LATEST}.tmp-{token:010x}")
    _write_bytes(pointer_tmp, (os.path.basename(final) + "\n").encode())
    os.replace(pointer_tmp, os.path.join(root, LATEST))
    _fsync_dir(root)
    if keep:
        done = list_checkpoints(root)
        for p in done[:-keep]:
            if os.path.abspath(p) != os.path.abspath(final):
                shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------------------
class _Reader:
    """Loads (and checks) the checkpoint's files on demand, each once."""

    def __init__(self, ckdir: str, man: Mapping[str, Any], verify: bool) -> None:
        self.ckdir, self.man, self.verify = ckdir, man, verify
        self.cache: dict[str, dict[str, Any]] = {}

    def file(self, fname: str) -> dict[str, Any]:
        if fname not in self.cache:
            path = os.path.join(self.ckdir, fname)
            meta = self.man["files"].get(fname)
            if meta is None:
                raise CheckpointError(f"the manifest of {self.ckdir} refers to {fname}, which it does not list: "
                                      f"the manifest is damaged; {_alternatives(self.ckdir)}")
            if self.verify and _sha256_file(path) != meta["sha256"]:
                raise CheckpointError(f"{path}: sha256 differs from the manifest's: the file is corrupt; "
                                      f"{_alternatives(self.ckdir)}")
            try:
                self.cache[fname] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # torch raises several kinds for damaged zip/pickle data
                raise CheckpointError(f"{path} cannot be read by torch.load ({type(e).__name__}: {e}); "
                                      f"{_alternatives(self.ckdir)}") from None
        return self.cache[fname]

    def assemble(self, name: str, offsets: Sequence[int], shape: Sequence[int]) -> torch.Tensor:
        """The box ``[offsets, offsets + shape)`` of tensor ``name``'s dense form, from the saved tiles."""
        info = self.man["tensors"][name]
        out = torch.empty(tuple(shape), dtype=_dtype_of(info["dtype"]))
        covered = 0
        for t in info["tiles"]:
            ov = _overlap(offsets, shape, t["offsets"], t["shape"])
            if ov is None:
                continue
            lo, hi = ov
            src = self.file(t["file"])["tensors"].get(t["key"])
            if src is None or list(src.shape) != list(t["shape"]):
                raise CheckpointError(f"{os.path.join(self.ckdir, t['file'])}: tile {t['key']!r} is missing or has "
                                      f"the wrong shape; {_alternatives(self.ckdir)}")
            dst = tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, offsets))
            srs = tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, t["offsets"]))
            out[dst] = src[srs]
            covered += math.prod(h - l for l, h in zip(lo, hi))
        if covered != math.prod(shape):
            raise CheckpointError(f"{name}: the checkpoint's tiles cover {covered} of the {math.prod(shape)} "
                                  f"elements this rank needs; the manifest of {self.ckdir} is damaged")
        return out


def _target(reader: _Reader, e: _Entry, where: str) -> torch.Tensor:
    """This rank's new data for entry ``e`` (shape and dtype of ``e.tensor``)."""
    info = reader.man["tensors"][e.name]
    if tuple(info["dense_shape"]) != e.dense_shape:
        raise CheckpointError(f"{e.name}: the checkpoint {where} holds dense shape {tuple(info['dense_shape'])}, "
                              f"this model has {e.dense_shape}: it was saved from a model of other sizes (grid "
                              f"{reader.man['grid']}, step {reader.man['step']}); build the model with the "
                              f"checkpoint's sizes, or start fresh / point the resume path elsewhere")
    tile = reader.assemble(e.name, e.offsets, e.tile_shape)
    part = e.tile.part_of(tile) if e.tile is not None and e.tile.split_dim else tile.reshape(e.tensor.shape)
    return part.to(e.tensor.dtype)


def load_checkpoint(path: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, grid=None, *,
                    generators: Optional[Mapping[str, torch.Generator]] = None, strict: bool = True,
                    verify: bool = True, restore_rng: bool = True) -> LoadInfo:
    """Load the checkpoint at ``path`` (a checkpoint directory, or a root with a ``latest`` pointer) into
    ``model`` (and ``optimizer``), on any grid.

    Collective (one agreement all-reduce, posted after all checks): every rank of ``grid`` calls it. ``strict``:
    the model's tensors and the checkpoint's must match by name. ``verify``: check the sha256 of every file read.
    RNG states (global and ``generators``) are restored per rank when the grid is unchanged, else from the
    saving rank 0 on every rank. On any error every rank raises :class:`CheckpointError` and nothing is changed.
    """
    rank, world = _rank_world(grid)
    err: Optional[CheckpointError] = None
    staged: list[tuple[torch.Tensor, torch.Tensor]] = []
    opt_state: Optional[dict[str, Any]] = None
    info: Optional[LoadInfo] = None
    rng_state: Optional[Mapping[str, Any]] = None
    where = path
    try:
        ckdir = resolve_checkpoint(path)
        where = ckdir
        man = _read_manifest(ckdir)
        _check_files(ckdir, man)
        reader = _Reader(ckdir, man, verify)
        saved = man["tensors"]
        mine = _model_entries(model)
        for e in mine:
            _check_entry(e, grid)
        have = {e.name for e in mine}
        ck_model = {n for n, v in saved.items() if v["kind"] in ("param", "buffer")}
        if strict and (have - ck_model or ck_model - have):
            miss = sorted(x[6:] for x in have - ck_model)[:8]
            extra_ = sorted(x[6:] for x in ck_model - have)[:8]
            raise CheckpointError(f"the checkpoint {ckdir} and this model hold different tensors: missing from the "
                                  f"checkpoint {miss}, not in the model {extra_}; build the same model (or pass "
                                  f"strict=False to load the common ones)")
        for e in mine:
            if e.name in saved:
                staged.append((e.tensor, _target(reader, e, ckdir)))
        if optimizer is not None:
            opt_state = _stage_optimizer(reader, model, optimizer, grid, ckdir)
        same = (man["world_size"] == world and man["grid"] == _grid_str(grid)
                and man.get("order") == (None if grid is None else grid.order))
        rng_note = "not restored"
        if restore_rng:
            src = rank if same else 0
            rng_state = reader.file(f"rank-{src:05d}.pt")["rng"]
            missing = [k for k in (generators or {}) if k not in rng_state.get("generators", {})]
            if missing:
                raise CheckpointError(f"generator(s) {missing} are not in the checkpoint {ckdir} (it holds "
                                      f"{man.get('generators')}): pass the same generators= to save and load")
            rng_note = "per-rank" if same else "from rank 0"
        info = LoadInfo(ckdir, int(man["step"]), dict(man.get("extra") or {}), man["grid"], man["world_size"],
                        not same, rng_note, opt_state is not None)
    except CheckpointError as ex:
        err = ex
    (failed,) = _agree(grid, [int(err is not None)])
    if err is not None:
        raise err
    if failed:
        raise CheckpointError(f"{failed} rank(s) could not load the checkpoint {where} (see their errors); "
                              f"nothing was changed")
    assert info is not None
    with torch.no_grad():
        for dst, src in staged:
            dst.copy_(src)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)  # type: ignore[union-attr]
    if rng_state is not None:
        _restore_rng(rng_state, generators, where)
    return info


def _stage_optimizer(reader: _Reader, model: nn.Module, opt: torch.optim.Optimizer, grid,
                     ckdir: str) -> dict[str, Any]:
    """The ``optimizer.load_state_dict`` argument for this rank, built from the checkpoint."""
    desc = reader.man.get("optimizer")
    if not desc:
        raise CheckpointError(f"the checkpoint {ckdir} holds no optimizer state (it was saved without an "
                              f"optimizer): load it with optimizer=None")
    if desc["class"] != type(opt).__name__:
        raise CheckpointError(f"the checkpoint {ckdir} holds {desc['class']} state, this optimizer is "
                              f"{type(opt).__name__}: use the same optimizer class, or load with optimizer=None")
    names = _param_names(model)
    cur = opt.state_dict()
    if len(desc["param_groups"]) != len(opt.param_groups):
        raise CheckpointError(f"the checkpoint {ckdir} has {len(desc['param_groups'])} optimizer parameter groups, "
                              f"this optimizer has {len(opt.param_groups)}: build the optimizer the same way")
    state: dict[int, dict[str, Any]] = {}
    groups = []
    for gi, (g, sg, cg) in enumerate(zip(opt.param_groups, desc["param_groups"], cur["param_groups"])):
        pnames = [names.get(id(p), "?") for p in g["params"]]
        if pnames != sg["params"]:
            raise CheckpointError(f"optimizer parameter group {gi}: the checkpoint {ckdir} holds parameters "
                                  f"{sg['params'][:6]}..., this optimizer {pnames[:6]}...: build it the same way")
        groups.append({**cg, **{k: _like(v, cg[k]) for k, v in sg.items() if k != "params" and k in cg}})
        for p, pname, idx in zip(g["params"], pnames, cg["params"]):
            st: dict[str, Any] = {}
            tile = tile_of(p)
            rep = getattr(p, "axgrid_replicated", None) or ("d" if tile is not None else "xyzd")
            for key in desc["state_keys"].get(pname, []):
                name = f"optim/{pname}/{key}"
                info = reader.man["tensors"].get(name)
                if info is None:
                    raise CheckpointError(f"{name} is listed as optimizer state but has no tiles in {ckdir}: the "
                                          f"manifest is damaged; {_alternatives(ckdir)}")
                if info["kind"] == "optim":
                    like = torch.empty(p.shape, dtype=_dtype_of(info["dtype"]))
                    st[key] = _target(reader, _Entry(name, like, tile, rep, "optim"), ckdir)
                else:
                    st[key] = reader.assemble(name, [0] * len(info["dense_shape"]), info["dense_shape"])
            st.update(desc["values"].get(pname, {}))
            if st:
                state[idx] = st
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------------------------------------------
# convenience: a manager and save-on-signal
# ---------------------------------------------------------------------------------------------------------
class CheckpointManager:
    """Checkpoints of one run under ``root``: ``save(step, ...)``, ``resume(...)``, keeping the newest ``keep``."""

    def __init__(self, root: str, grid=None, keep: Optional[int] = 2) -> None:
        self.root, self.grid, self.keep = root, grid, keep

    def latest(self) -> Optional[str]:
        return latest_checkpoint(self.root)

    def save(self, step: int, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
             extra: Optional[Mapping[str, Any]] = None,
             generators: Optional[Mapping[str, torch.Generator]] = None) -> str:
        return save_checkpoint(self.root, model, optimizer, self.grid, step=step, extra=extra,
                               generators=generators, keep=self.keep)

    def resume(self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any
               ) -> Optional[LoadInfo]:
        """Load the latest checkpoint if there is one (all ranks must agree it exists); None otherwise."""
        found = self.latest() is not None
        (n,) = _agree(self.grid, [int(found)])
        world = _rank_world(self.grid)[1]
        if n == 0:
            return None
        if n != world:
            raise CheckpointError(f"only {n} of {world} ranks see a checkpoint under {self.root}: the checkpoint "
                                  f"directory must be on a file system shared by all ranks")
        return load_checkpoint(self.root, model, optimizer, self.grid, **kwargs)


class SaveOnSignal:
    """Turn SIGTERM / SIGUSR1 into a stop request that all ranks agree on at a step boundary.

    ``with SaveOnSignal(grid) as stop:`` installs the handlers (the previous ones come back on exit); a signal
    only sets a flag. ``stop.should_stop()`` is collective (a one-integer all-reduce over the grid): call it on
    every rank at the same step boundaries; it returns True on every rank once any rank got a signal, and
    ``stop.stopped`` stays True afterwards. Then save and leave the training loop; a job killed at its time
    limit (Slurm: ``#SBATCH --signal=USR1@120`` sends SIGUSR1 120 s before) resumes from that checkpoint.
    Handlers can only be installed in the main thread.
    """

    def __init__(self, grid=None, signals: Iterable[int] = (signal.SIGTERM, signal.SIGUSR1)) -> None:
        self.grid = grid
        self.signals = tuple(signals)
        self.received: Optional[int] = None     # the first signal this rank got
        self.stopped = False                    # all ranks agreed to stop
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum

    def install(self) -> "SaveOnSignal":
        """Install the handlers (what ``with`` does on entry); returns self."""
        for s in self.signals:
            if s not in self._previous:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def uninstall(self) -> None:
        """Put the previous handlers back (what ``with`` does on exit)."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def __enter__(self) -> "SaveOnSignal":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    @property
    def requested(self) -> bool:
        """This rank got a signal (local; no communication)."""
        return self.received is not None

    @property
    def signal_name(self) -> Optional[str]:
        return None if self.received is None else signal.Signals(self.received).name

    def should_stop(self) -> bool:
        """Collective: True on every rank when any rank got one of the signals."""
        if not self.stopped:
            (n,) = _agree(self.grid, [int(self.requested)])
            self.stopped = n > 0
        return self.stopped


def _main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m axgrid.checkpoint PATH``: verify a checkpoint (sizes, sha256) and summarise it."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m axgrid.checkpoint", description=_main.__doc__)
    ap.add_argument("path", help="checkpoint directory, or a root with a 'latest' pointer")
    a = ap.parse_args(argv)
    try:
        man = verify_checkpoint(a.path)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    total = sum(m["bytes"] for m in man["files"].values())
    print(f"{resolve_checkpoint(a.path)}: step {man['step']}, grid {man['grid']} (order {man['order']}), "
          f"{man['world_size']} ranks, {len(man['tensors'])} tensors, {len(man['files'])} files, {total:,} bytes, "
          f"optimizer {man['optimizer']['class'] if man['optimizer'] else 'none'}: OK")
    for name, t in man["tensors"].items():
        print(f"  {name:<48} {t['dtype']:<9} {str(tuple(t['dense_shape'])):<16} {len(t['tiles'])} tile(s)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
