"""Loading on any grid: assemble each rank's part from the saved tiles that overlap it (only the boxes of
:func:`axgrid.spec.tiles.part_boxes` are read), then apply all at once."""
from __future__ import annotations

import os
import warnings
from typing import Any, Iterable, Iterator, Mapping, Optional

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..spec import Box, overlap, part_boxes
from ..io import TensorPart, raise_on_any_rank, read_part
from .format import CheckpointError, CheckpointWarning, LoadInfo, _dtype_of, _grid_str, _like, _rank_world, _sha256_file
from .runconfig import compare_config
from .state import _check_entry, _model_entries, _param_names, _restore_rng, optimizer_slots
from .store import _alternatives, _check_files, _read_manifest, resolve_checkpoint

#: Bytes read through the files' mappings before they are dropped: a page of a mapped file that was read stays
#: in this process's RSS until the mapping goes, so it is dropped (and reopened on demand) every ~this many
#: bytes; each reopening costs one ``torch.load`` of the file's index (tens of ms).
_MAPPED_BAND = 16 * 2**20
#: Optimizer-group settings that say how the step is computed, not what it computes: this run's own are kept on
#: loading (a checkpoint of a fused AdamW resumes with the for-loop one on a device without the kernel, and back).
IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


class _Reader:
    """Maps (and checks, once) the checkpoint's files on demand; :meth:`release` drops the mappings."""

    def __init__(self, ckdir: str, man: Mapping[str, Any], verify: bool) -> None:
        self.ckdir, self.man, self.verify = ckdir, man, verify
        self.cache: dict[str, dict[str, Any]] = {}
        self.verified: set[str] = set()
        self.bytes_read = 0                                   # of tensor data, in the saved dtype
        self.mapped_read = 0                                  # read since the mappings were last dropped

    def release(self, band: int = 0) -> None:
        """Drop the files' mappings (their read pages leave RSS) once ``band`` bytes were read through them."""
        if self.mapped_read >= band:
            self.cache.clear()
            self.mapped_read = 0

    def file(self, fname: str) -> dict[str, Any]:
        if fname not in self.cache:
            path = os.path.join(self.ckdir, fname)
            meta = self.man["files"].get(fname)
            if meta is None:
                raise CheckpointError(f"the manifest of {self.ckdir} refers to {fname}, which it does not list: "
                                      f"the manifest is damaged; {_alternatives(self.ckdir)}")
            if self.verify and fname not in self.verified:
                if _sha256_file(path) != meta["sha256"]:
                    raise CheckpointError(f"{path}: sha256 differs from the manifest's: the file is corrupt; "
                                          f"{_alternatives(self.ckdir)}")
                self.verified.add(fname)
            try:
                self.cache[fname] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # torch raises several kinds for damaged zip/pickle data
                raise CheckpointError(f"{path} cannot be read by torch.load ({type(e).__name__}: {e}); "
                                      f"{_alternatives(self.ckdir)}") from None
        return self.cache[fname]

    def _pieces(self, name: str, box: Box) -> Iterator[tuple[Box, torch.Tensor, Box]]:
        """``(overlap, saved tensor, saved box)`` for each saved box of ``name`` that overlaps ``box``; raises
        unless they cover ``box`` (files are opened and checked, no data is read)."""
        covered = 0
        for t in self.man["tensors"][name]["tiles"]:
            saved = Box(tuple(t["offsets"]), tuple(t["shape"]))
            ov = overlap(box, saved)
            if ov is None:
                continue
            src = self.file(t["file"])["tensors"].get(t["key"])
            if src is None or list(src.shape) != list(t["shape"]):
                raise CheckpointError(f"{os.path.join(self.ckdir, t['file'])}: tile {t['key']!r} is missing or has "
                                      f"the wrong shape; {_alternatives(self.ckdir)}")
            covered += ov.numel
            yield ov, src, saved
        if covered != box.numel:
            raise CheckpointError(f"{name}: the checkpoint's tiles cover {covered} of the {box.numel} "
                                  f"elements this rank needs; the manifest of {self.ckdir} is damaged")

    def check(self, e: TensorPart) -> None:
        """Entry ``e`` can be read: dense shapes agree, its part's boxes are covered, the files are sound."""
        info = self.man["tensors"][e.name]
        if tuple(info["dense_shape"]) != e.dense_shape:
            raise CheckpointError(f"{e.name}: the checkpoint {self.ckdir} holds dense shape "
                                  f"{tuple(info['dense_shape'])}, this model has {e.dense_shape}: it was saved from "
                                  f"a model of other sizes (grid {self.man['grid']}, step {self.man['step']}); build "
                                  f"the model with the checkpoint's sizes, or start fresh / point the resume path "
                                  f"elsewhere")
        for box in part_boxes(e.spec):
            self.check_box(e.name, box)

    def check_box(self, name: str, box: Box) -> None:
        """The saved boxes of ``name`` cover ``box`` and their files are sound (no data read)."""
        for _ in self._pieces(name, box):
            pass

    def assemble(self, name: str, box: Box) -> torch.Tensor:
        """The ``box`` of tensor ``name``'s dense form, from the saved boxes (counted in ``bytes_read``)."""
        out = torch.empty(box.shape, dtype=_dtype_of(self.man["tensors"][name]["dtype"]))
        for ov, src, saved in self._pieces(name, box):
            out[ov.slices(box.offsets)] = src[ov.slices(saved.offsets)]
            self.bytes_read += ov.numel * out.element_size()
            self.mapped_read += ov.numel * out.element_size()
        return out

    def part(self, e: TensorPart, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """This rank's new data for entry ``e`` (shape and dtype of ``e.tensor``), read box by box (into
        ``out``, e.g. ``e.tensor`` itself, when given)."""
        self.check(e)
        part = read_part(e.spec, lambda box: self.assemble(e.name, box), dtype=e.tensor.dtype, out=out)
        self.release(_MAPPED_BAND)
        return part.reshape(e.tensor.shape)


def load_checkpoint(path: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, grid=None, *,
                    generators: Optional[Mapping[str, torch.Generator]] = None, strict: bool = True,
                    verify: bool = True, restore_rng: bool = True, config: Optional[Mapping[str, Any]] = None,
                    allow_changes: Iterable[str] = ()) -> LoadInfo:
    """Load the checkpoint at ``path`` (a checkpoint directory, or a root with a ``latest`` pointer) into
    ``model`` (and ``optimizer``), on any grid.

    Collective (agreement all-reduces, the first posted after all checks): every rank of ``grid`` calls it. ``strict``:
    the model's tensors and the checkpoint's must match by name. ``verify``: check the sha256 of every file read.
    RNG states (global and ``generators``) are restored per rank when the grid is unchanged, else from the
    saving rank 0 on every rank. ``config``: this run's settings, compared field by field with those the
    checkpoint was saved with (see :func:`save_checkpoint`); a difference raises :class:`ConfigMismatch` naming
    the fields, unless listed in ``allow_changes`` (field names like ``"steps"``, or prefixes like ``"model"``).
    On any error every rank raises :class:`CheckpointError` and nothing is changed (every check, the sha256
    of every file included, comes before the first tensor is written; only a disk failing during the reads
    after them can leave the model partly loaded, and then every rank raises too).

    Memory: the model's tensors are read one at a time, each rank reading only the boxes of its own parts
    (``LoadInfo.bytes_read``), the optimizer's state after the model's, into its existing state tensors where it
    has them; the files' mappings are dropped every ~16 MiB read, so their pages do not pile up in RSS. Two
    agreement all-reduces in all.
    """
    rank, world = _rank_world(grid)
    err: Optional[CheckpointError] = None
    todo: list[TensorPart] = []
    reader: Optional[_Reader] = None
    opt_state: Optional[dict[str, Any]] = None
    opt_pending: list = []
    info: Optional[LoadInfo] = None
    rng_state: Optional[Mapping[str, Any]] = None
    where = path
    if grid is not None:
        grid.runtime.dp.finish()        # zero >= 1 with ODP: no parameter all-gather may land after the load
    try:
        ckdir = resolve_checkpoint(path)
        where = ckdir
        man = _read_manifest(ckdir)
        note = compare_config(man.get("config"), config, allow_changes, ckdir)
        if note is not None and rank == 0:
            warnings.warn(note, CheckpointWarning, stacklevel=2)
        _check_files(ckdir, man)
        reader = _Reader(ckdir, man, verify)
        saved = man["tensors"]
        mine = _model_entries(model)
        for e in mine:
            _check_entry(e, grid)
        have = {e.name for e in mine}
        ck_model = {n for n, v in saved.items() if v["kind"] in ("param", "buffer")
                    and not (v.get("expert") and n not in have)}     # a model under ep > 1 holds some experts
        if strict and (have - ck_model or ck_model - have):
            miss = sorted(x[6:] for x in have - ck_model)[:8]
            extra_ = sorted(x[6:] for x in ck_model - have)[:8]
            raise CheckpointError(f"the checkpoint {ckdir} and this model hold different tensors: missing from the "
                                  f"checkpoint {miss}, not in the model {extra_}; build the same model (or pass "
                                  f"strict=False to load the common ones)")
        todo = [e for e in mine if e.name in saved]
        for e in todo:                                  # every check before anything changes; no data read
            reader.check(e)
        if optimizer is not None:
            opt_state, opt_pending = _stage_optimizer(reader, model, optimizer, grid, ckdir)
        same = (man["world_size"] == world and man["grid"] == _grid_str(grid)
                and man.get("order") == (None if grid is None else grid.order))
        rng_note = "not restored"
        if restore_rng:
            src = rank if same else 0
            rng_state = tree_map(lambda v: v.clone() if torch.is_tensor(v) else v,   # not a view of the mapping
                                 reader.file(_rank_file(man, src, ckdir))["rng"])
            missing = [k for k in (generators or {}) if k not in rng_state.get("generators", {})]
            if missing:
                raise CheckpointError(f"generator(s) {missing} are not in the checkpoint {ckdir} (it holds "
                                      f"{man.get('generators')}): pass the same generators= to save and load")
            rng_note = "per-rank" if same else "from rank 0"
        info = LoadInfo(ckdir, int(man["step"]), dict(man.get("extra") or {}), man["grid"], man["world_size"],
                        not same, rng_note, opt_state is not None, dict(man.get("config") or {}),
                        saved_zero=int(man.get("zero") or 0))
    except CheckpointError as ex:
        err = ex
    raise_on_any_rank(grid, err, lambda n: CheckpointError(
        f"{n} rank(s) could not load the checkpoint {where} (see their errors); nothing was changed"))
    assert info is not None and reader is not None
    try:                                                # one tensor's part in flight at a time
        with torch.no_grad():
            for e in todo:
                reader.part(e, out=e.tensor)
            _read_optimizer(reader, opt_pending)
    except (CheckpointError, OSError, RuntimeError) as ex:   # checked above: only a failing disk gets here
        err = ex if isinstance(ex, CheckpointError) else CheckpointError(
            f"reading {where} failed on rank {rank} ({type(ex).__name__}: {ex})")
    reader.release()
    raise_on_any_rank(grid, err, lambda n: CheckpointError(f"{n} rank(s) failed reading {where} (see their errors)"))
    info.bytes_read = reader.bytes_read
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)  # type: ignore[union-attr]
    if rng_state is not None:
        _restore_rng(rng_state, generators, where)
    return info


def _rank_file(man: Mapping[str, Any], rank: int, ckdir: str) -> str:
    """The manifest's file written by ``rank`` (it holds that rank's RNG state)."""
    for fname, meta in man["files"].items():
        if meta.get("rank", rank if fname == f"rank-{rank:05d}.pt" else None) == rank:
            return fname
    raise CheckpointError(f"the manifest of {ckdir} lists no file of rank {rank}: the manifest is damaged; "
                          f"{_alternatives(ckdir)}")


def _stage_optimizer(reader: _Reader, model: nn.Module, opt: torch.optim.Optimizer, grid,
                     ckdir: str) -> tuple[dict[str, Any], list]:
    """The ``optimizer.load_state_dict`` argument for this rank, checked against the checkpoint but with its
    tensors still to read (the second item: what :func:`_read_optimizer` reads, after the agreement)."""
    desc = reader.man.get("optimizer")
    if not desc:
        raise CheckpointError(f"the checkpoint {ckdir} holds no optimizer state (it was saved without an "
                              f"optimizer): load it with optimizer=None")
    cls, slots = optimizer_slots(opt)
    if desc["class"] != cls:
        raise CheckpointError(f"the checkpoint {ckdir} holds {desc['class']} state, this optimizer is "
                              f"{cls}: use the same optimizer class, or load with optimizer=None")
    names = _param_names(model)
    cur = opt.state_dict()
    if len(desc["param_groups"]) != len(opt.param_groups):
        raise CheckpointError(f"the checkpoint {ckdir} has {len(desc['param_groups'])} optimizer parameter groups, "
                              f"this optimizer has {len(opt.param_groups)}: build the optimizer the same way")
    state: dict[int, dict[str, Any]] = {}
    pending: list = []
    groups = []
    for gi, (row, sg, cg) in enumerate(zip(slots, desc["param_groups"], cur["param_groups"])):
        pnames = [names.get(id(p), "?") for p, _, _, _ in row]
        held = set(pnames)                # of the checkpoint's experts, only those this rank holds (ep > 1)
        if pnames != [n for n in sg["params"] if n in held or not reader.man["tensors"].get(f"model/{n}", {}).get(
                "expert")]:
            raise CheckpointError(f"optimizer parameter group {gi}: the checkpoint {ckdir} holds parameters "
                                  f"{sg['params'][:6]}..., this optimizer {pnames[:6]}...: build it the same way")
        groups.append({**cg, **{k: _like(v, cg[k]) for k, v in sg.items()
                                if k != "params" and k in cg and k not in IMPLEMENTATION}})
        for (p, q, tile, rep), pname, idx in zip(row, pnames, cg["params"]):
            st: dict[str, Any] = {}
            for key in desc["state_keys"].get(pname, []):
                name = f"optim/{pname}/{key}"
                info = reader.man["tensors"].get(name)
                if info is None:
                    raise CheckpointError(f"{name} is listed as optimizer state but has no tiles in {ckdir}: the "
                                          f"manifest is damaged; {_alternatives(ckdir)}")
                if info["kind"] == "optim":
                    dtype, have = _dtype_of(info["dtype"]), opt.state.get(q, {}).get(key)
                    fits = (torch.is_tensor(have) and have.shape == q.shape and have.dtype == dtype
                            and have.device == q.device)
                    # read straight to the state's device: nothing the size of the optimizer staged on the host
                    like = have.detach() if fits else torch.empty(q.shape, dtype=dtype, device=q.device)
                    e = TensorPart(name, like, tile, rep, "optim")
                    reader.check(e)
                    pending.append((st, key, e, None))
                else:
                    shape = tuple(info["dense_shape"])
                    whole = Box((0,) * len(shape), shape)
                    reader.check_box(name, whole)
                    pending.append((st, key, None, (name, whole)))
            st.update(desc["values"].get(pname, {}))
            if st or desc["state_keys"].get(pname):
                state[idx] = st
    return {"state": state, "param_groups": groups}, pending


def _read_optimizer(reader: _Reader, pending: list) -> None:
    """Read the optimizer state :func:`_stage_optimizer` checked, one tensor at a time, into the optimizer's
    own state tensors where it has them (no second copy)."""
    for st, key, e, scalar in pending:
        st[key] = reader.part(e, out=e.tensor) if e is not None else reader.assemble(*scalar)
