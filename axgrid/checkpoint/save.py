"""Saving: every rank writes its own parts (as boxes of the dense tensors, no gather) into a temporary directory,
rank 0 finishes it atomically."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import time
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from ..spec import Box, part_boxes
from ..io import TensorPart, agree, dtype_name, fingerprint, raise_on_any_rank
from ..data_parallel.replicas import check_replicas
from .format import (_STEP_DIR, FORMAT, LATEST, MANIFEST, VERSION, CheckpointError, _fsync_dir, _grid_str, _rank_world,
                     _sha256_file, _write_bytes)
from .runconfig import config_record
from .state import _check_entry, _model_entries, _optim_entries, _rng_state
from .store import list_checkpoints

def _is_writer(grid, e: TensorPart, expert: bool = False) -> bool:
    """One rank per distinct part: coordinate 0 along every letter the part is replicated over (an expert's part,
    distinct over the expert-parallel group ``"e"``: index 0 in its replica group ``"r"`` instead of along d)."""
    if grid is None:
        return True
    letters = set(e.replicated) & set("xyzd")
    if expert and "d" in letters:
        letters.discard("d")
        if grid.index("r") != 0:
            return False
    return all(grid.coord[c] == 0 for c in letters)


def _expert_names(model: nn.Module) -> set[str]:
    """The parameter names of ``model``'s experts (``axgrid_expert``: each e-rank holds others, named by global id)."""
    return {n for n, p in model.named_parameters() if getattr(p, "axgrid_expert", False)}


def _is_expert_entry(name: str, experts: set[str]) -> bool:
    """Whether a checkpoint entry (``model/<param>`` or ``optim/<param>/<key>``) belongs to an expert."""
    if name.startswith("model/"):
        return name[6:] in experts
    return name.startswith("optim/") and name[6:].rsplit("/", 1)[0] in experts


def _boxes_of(e: TensorPart) -> list[tuple[str, Box, torch.Tensor]]:
    """``(key, box, data)`` for each box of this rank's part (:func:`axgrid.spec.tiles.part_boxes`): views of the part
    on the CPU (a copy only from another device, or when the part is a view into a larger buffer)."""
    flat = e.tensor.detach().reshape(-1)
    if flat.device.type != "cpu" or flat.untyped_storage().nbytes() != flat.numel() * flat.element_size():
        flat = flat.to("cpu", copy=True)
    boxes = part_boxes(e.spec)
    out, pos = [], 0
    for i, box in enumerate(boxes):
        key = e.name if len(boxes) == 1 else f"{e.name}#{i}"
        out.append((key, box, flat[pos: pos + box.numel].view(box.shape)))
        pos += box.numel
    return out


def save_checkpoint(root: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    grid=None, *, step: int, extra: Optional[Mapping[str, Any]] = None,
                    generators: Optional[Mapping[str, torch.Generator]] = None, keep: Optional[int] = 2,
                    config: Optional[Mapping[str, Any]] = None) -> str:
    """Save ``model`` (and ``optimizer``) as ``root/step-<step>`` and point ``root/latest`` at it.

    Collective: every rank of ``grid`` must call it with the same arguments (``grid=None``: a serial model in
    one process). ``extra``: JSON-serialisable run state (data position, scheduler, ...) returned by
    :func:`load_checkpoint`. ``generators``: named ``torch.Generator`` whose per-rank states are saved with the
    global torch / python / numpy RNG states. ``keep``: complete checkpoints to keep (None: all). ``config``: the
    run's settings (model sizes, seed, data, schedule; nested mappings allowed), which :func:`load_checkpoint`
    compares with the resuming run's. Returns the checkpoint directory. Raises :class:`CheckpointError` on every
    rank when any rank fails; the previous checkpoints and ``latest`` are then untouched, and the failed save's
    files are removed (those of a save killed on the way are removed by the next save).
    """
    rank, world = _rank_world(grid)
    experts = _expert_names(model)
    if grid is not None:
        check_replicas(model, grid)          # a checkpoint keeps one replica: make every replica that one first
    final = os.path.join(root, f"step-{int(step):08d}")
    err: Optional[CheckpointError] = None
    entries: list[TensorPart] = []
    optim_desc: Optional[dict[str, Any]] = None
    rng: dict[str, Any] = {}
    record: Optional[dict[str, Any]] = None
    if rank == 0:
        with contextlib.suppress(OSError):  # before any rank can create this save's temporary directory
            _sweep(root)
    if grid is not None:
        grid.runtime.dp.finish()        # zero >= 1 with ODP: the parameters' last all-gathers land first
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
        record = config_record(config)
        rng = _rng_state(generators)
    except CheckpointError as ex:
        err = ex
    fp = fingerprint([e for e in entries if not _is_expert_entry(e.name, experts)])   # experts differ over "e"
    token = secrets.randbits(40) if rank == 0 else 0   # not torch's RNG: saving must not change training
    failed, s1, s2, token = agree(grid, [int(err is not None), fp, fp * fp, token])
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
    for e in entries:                                   # no collective: each writer saves its own part's boxes
        if _is_writer(grid, e, _is_expert_entry(e.name, experts)):
            for key, box, data in _boxes_of(e):
                tensors[key] = data
                tiles.append({"name": e.name, "key": key, "offsets": list(box.offsets), "shape": list(box.shape)})
    try:
        os.makedirs(tmp, exist_ok=True)
        path = os.path.join(tmp, fname)
        with open(path, "wb") as f:                    # streamed to the file: no second copy in memory
            torch.save({"tensors": tensors, "rng": rng}, f)
            f.flush()
            os.fsync(f.fileno())
        tensors.clear()
        index = {"rank": rank, "file": fname, "bytes": os.path.getsize(path), "sha256": _sha256_file(path),
                 "tiles": tiles, "e": 0 if grid is None else grid.index("e"), "optimizer": optim_desc,
                 "experts": {e.name: _tensor_meta(e) for e in entries if _is_expert_entry(e.name, experts)}}
        _write_bytes(os.path.join(tmp, f"rank-{rank:05d}.json"), json.dumps(index).encode())
    except Exception as ex:  # OSError, or torch.save failing: every rank must still reach the agreement below
        err = CheckpointError(f"rank {rank} could not write {os.path.join(tmp, fname)}: {type(ex).__name__}: {ex}")
    raise_on_any_rank(grid, err, lambda n: CheckpointError(
        f"{n} rank(s) failed writing {final} (see their errors); the previous checkpoints and "
        f"{os.path.join(root, LATEST)} are untouched"),
        cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True) if rank == 0 else None)   # raised once gone
    if rank == 0:
        try:
            _finish(root, tmp, final, entries, optim_desc, grid, world, int(step), extra, record, generators, keep,
                    token)
        except Exception as ex:
            shutil.rmtree(tmp, ignore_errors=True)
            _remove(os.path.join(root, f"{LATEST}.tmp-{token:010x}"))
            err = ex if isinstance(ex, CheckpointError) else CheckpointError(
                f"finishing {final} failed ({type(ex).__name__}: {ex}); {os.path.join(root, LATEST)} still names "
                f"a complete checkpoint")
    raise_on_any_rank(grid, err, lambda n: CheckpointError(
        f"rank 0 failed to finish {final} (see its error); the previous checkpoints are untouched"))
    return final


def _finish(root: str, tmp: str, final: str, entries: Sequence[TensorPart], optim_desc: Optional[dict[str, Any]],
            grid, world: int, step: int, extra: Optional[Mapping[str, Any]], record: Optional[dict[str, Any]],
            generators: Optional[Mapping[str, torch.Generator]], keep: Optional[int], token: int) -> None:
    """Rank 0, after every rank wrote its file: manifest, move into place, ``latest``, pruning.

    A new step: ``tmp`` (manifest included) is renamed to ``final`` in one step. Saving a step again: the new
    rank files move into the existing ``final`` under fresh names, then its manifest is replaced in one step
    (the commit), then the old files go. Either way ``final`` holds one complete checkpoint at every moment, so
    ``latest`` never names a missing or half-written one, whenever the process dies."""
    again = os.path.isfile(os.path.join(final, MANIFEST)) and not os.path.islink(final)
    names = {f"rank-{r:05d}.pt": (f"rank-{r:05d}.{token:010x}.pt" if again else f"rank-{r:05d}.pt")
             for r in range(world)}
    files: dict[str, Any] = {}
    tiles: dict[str, list[dict[str, Any]]] = {}
    expert_meta: dict[str, dict[str, Any]] = {}           # every e-rank's experts, by entry name
    descs: dict[int, Optional[dict[str, Any]]] = {}      # the optimizer's description of each e-index's first rank
    for r in range(world):
        ipath = os.path.join(tmp, f"rank-{r:05d}.json")
        with open(ipath) as f:
            idx = json.load(f)
        fname = names[idx["file"]]
        files[fname] = {"bytes": idx["bytes"], "sha256": idx["sha256"], "rank": r}
        for t in idx["tiles"]:
            lst = tiles.setdefault(t["name"], [])
            if not any(o["offsets"] == t["offsets"] and o["shape"] == t["shape"] for o in lst):
                lst.append({"file": fname, "key": t["key"], "offsets": t["offsets"], "shape": t["shape"]})
        for n, meta in idx.get("experts", {}).items():
            expert_meta.setdefault(n, meta)
        descs.setdefault(int(idx.get("e", 0)), idx.get("optimizer"))
    metas = {e.name: _tensor_meta(e) for e in entries if e.name not in expert_meta} | expert_meta
    tensors: dict[str, Any] = {}
    for name, meta in metas.items():
        got = tiles.get(name, [])
        covered = sum(math.prod(t["shape"]) for t in got)
        if covered != math.prod(meta["dense_shape"]):
            raise CheckpointError(f"{name}: the saved tiles cover {covered} of {math.prod(meta['dense_shape'])} "
                                  f"elements; its parameters' axgrid_replicated / axgrid_tile marks are wrong")
        tensors[name] = {**meta, "tiles": got} | ({"expert": True} if name in expert_meta else {})
    if optim_desc is not None and len(descs) > 1:
        optim_desc = _merge_optimizer(
            [descs[i] for i in sorted(descs)],
            {n[6:] for n in expert_meta if n.startswith("model/")})
    man = {"format": FORMAT, "version": VERSION, "step": step, "created": time.time(),
           "torch": torch.__version__, "grid": _grid_str(grid), "order": None if grid is None else grid.order,
           "world_size": world, "zero": 0 if grid is None else grid.runtime.config.zero,
           "tensors": tensors, "optimizer": optim_desc, "files": files,
           "generators": sorted(generators or {}), "extra": dict(extra or {}), "config": record}
    text = json.dumps(man, indent=1).encode()
    for r in range(world):
        os.remove(os.path.join(tmp, f"rank-{r:05d}.json"))
    if again:
        _replace_in_place(tmp, final, names, text, token)
    else:
        if os.path.lexists(final):            # a step-N without manifest (damaged): not a checkpoint, replace it
            _remove(final)
        _write_bytes(os.path.join(tmp, MANIFEST), text)
        _fsync_dir(tmp)
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


def _tensor_meta(e: TensorPart) -> dict[str, Any]:
    """A manifest entry's description of a tensor (its tiles added by rank 0)."""
    return {"dense_shape": list(e.dense_shape), "dtype": dtype_name(e.tensor.dtype), "kind": e.kind}


def _merge_optimizer(descs: Sequence[dict[str, Any]], experts: set[str]) -> dict[str, Any]:
    """One optimizer description from those of the e-ranks (in e-index order), each naming only its own experts:
    every group's parameters in a model's order with all experts held (between two parameters that every rank
    holds, e-index 0's experts, then e-index 1's, ...), their values and state keys together."""
    out = {**descs[0], "param_groups": [], "values": {}, "state_keys": {}}
    for d in descs:
        out["values"].update(d["values"])
        out["state_keys"].update(d["state_keys"])
    for gi, g in enumerate(descs[0]["param_groups"]):
        runs: list[list[list[str]]] = []               # per e-rank: its experts before each shared parameter
        shared: Optional[list[str]] = None
        for d in descs:
            names = d["param_groups"][gi]["params"]
            mine, cut = [[]], []
            for n in names:
                if n in experts:
                    mine[-1].append(n)
                else:
                    cut.append(n)
                    mine.append([])
            if shared is not None and cut != shared:
                raise CheckpointError(f"optimizer parameter group {gi} holds other parameters on different "
                                      f"expert-parallel ranks: build the optimizer the same way on every rank")
            shared = cut
            runs.append(mine)
        merged: list[str] = []
        for i in range(len(shared or []) + 1):
            for mine in runs:
                merged += mine[i]
            if i < len(shared or []):
                merged.append(shared[i])
        out["param_groups"].append({**g, "params": merged})
    return out


def _replace_in_place(tmp: str, final: str, names: Mapping[str, str], manifest: bytes, token: int) -> None:
    """Saving an existing step again: move the new files in beside the old ones, swap the manifest (atomic),
    drop the old files. On failure before the swap the moved-in files are removed again."""
    moved = []
    try:
        for src, dst in names.items():
            os.rename(os.path.join(tmp, src), os.path.join(final, dst))
            moved.append(os.path.join(final, dst))
        staged = os.path.join(final, f"{MANIFEST}.tmp-{token:010x}")
        moved.append(staged)
        _write_bytes(staged, manifest)
        os.replace(staged, os.path.join(final, MANIFEST))           # the commit
    except BaseException:
        for path in moved:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    _fsync_dir(final)
    keep = set(names.values()) | {MANIFEST}
    for name in os.listdir(final):
        if name not in keep:
            _remove(os.path.join(final, name))
    shutil.rmtree(tmp, ignore_errors=True)


def _remove(path: str) -> None:
    """Remove a file, a link (not its target) or a directory tree; errors are ignored."""
    with contextlib.suppress(OSError):
        if os.path.islink(path) or not os.path.isdir(path):
            os.remove(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


_LEFTOVER = re.compile(r"^(step-\d+\.(tmp|old)|latest\.tmp)-[0-9a-f]+$")
_STEP_FILE = re.compile(r"^(rank-\d+(\.[0-9a-f]+)?\.pt|manifest\.json\.tmp-[0-9a-f]+)$")


def _sweep(root: str) -> None:
    """Rank 0, before a save: remove what saves killed on the way left behind -- ``step-N.tmp-*`` directories,
    ``latest.tmp-*`` files, rank files a re-save moved in but never committed -- and put back a complete
    ``step-N.old-*`` (an interrupted re-save of an older axgrid) whose ``step-N`` is gone."""
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if _LEFTOVER.match(name):
            step_dir = os.path.join(root, name.split(".")[0])
            if (".old-" in name and not os.path.lexists(step_dir) and not os.path.islink(path)
                    and os.path.isfile(os.path.join(path, MANIFEST))):
                with contextlib.suppress(OSError):
                    os.rename(path, step_dir)
                continue                       # never delete the only complete copy of a step
            _remove(path)
        elif _STEP_DIR.match(name) and not os.path.islink(path) and os.path.isdir(path):
            try:
                with open(os.path.join(path, MANIFEST)) as f:
                    listed = set(json.load(f).get("files", {}))
            except (OSError, ValueError, AttributeError):
                continue                       # no readable manifest: not ours to tidy
            for fname in os.listdir(path):
                if _STEP_FILE.match(fname) and fname not in listed:
                    _remove(os.path.join(path, fname))
