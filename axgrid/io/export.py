"""Dense tensors, a dense model, or a Hugging Face export from a parallel model.

A parallel model's ``state_dict()`` holds each rank's part under the dense names (a Linear's weight is a 1-D
shard of its ``[n/Gy, k/Gx]`` block): loadable back on the same rank of the same grid, useless elsewhere. The
dense forms are assembled here through the parameters' :class:`~axgrid.spec.TileSpec`:

    for name, t in axgrid.iter_dense_state_dict(model, grid, rank=0):   # one dense tensor at a time, on rank 0
        ...                                                             # (the other ranks get nothing)
    axgrid.export_pretrained(model, "out", grid)   # HF checkpoint (sharded safetensors + index + config), streamed
    sd = axgrid.dense_state_dict(model, grid)      # {name: dense tensor} on every rank: small models only
    dense = axgrid.to_dense(model, grid)           # a dense copy on every rank: small models only

All are collective: every rank of the grid calls them (and exhausts the iterator). The streaming pair never
builds the dense model: the writing rank assembles a tensor slab by slab (dense rows, 16 MiB at a time) from the
other ranks' parts, which send the piece of their part in each slab point to point through the grid's
communicator (ledger ops ``send``/``recv``). The export writes each slab into its file as soon as it is complete,
so beyond its own parts the writing rank holds one slab and one received piece (two reused 16 MiB buffers),
whatever the size of the tensor (a 405B LLaMA's embedding table is 3.9 GiB in bf16); the iterator holds the one
dense tensor it yields; the other ranks hold only their own parts.
Training state (optimizer, RNG, resharding on another grid) belongs in :mod:`axgrid.checkpoint`.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn

from ..core.grid import Grid
from . import TensorPart, agree, fingerprint, model_parts, place_part, raise_on_any_rank
from ..spec import Box, row_segments
from ..tensor_parallel.linear import Linear
from .safetensors_writer import SafetensorsWriter
from ..spec import TileSpec


#: Bytes of dense rows assembled at a time on the writing rank (one slab; the pieces of it that the other ranks
#: send are at most as big).
CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class _Piece:
    """Member ``src`` (of the xyz group) holds the part ``tile`` (its TileSpec) of the dense tensor."""

    src: int
    tile: TileSpec

    @property
    def numel(self) -> int:
        start, stop = self.tile.part_range()
        return stop - start


def _checked_entries(model: nn.Module, grid: Grid, who: str) -> list:
    """The model's state entries, after checking (a collective) that every rank holds the same list (and with
    ``zero`` >= 1 the last step's parameter all-gathers complete)."""
    grid.runtime.dp.finish()
    entries = model_parts(model)
    spread = grid.size("e") > 1            # experts spread over ep > 1: each e-rank holds others (named apart)
    fp = fingerprint([e for e in entries if not (spread and _EXPERT_KEY.match(e.name[len("model/"):]))])
    s1, s2 = agree(grid, [fp, fp * fp])
    if s1 != grid.world_size * fp or s2 != grid.world_size * fp * fp:
        raise ValueError(f"{who}: ranks hold different tensors (names, shapes or dtypes): every rank must build "
                         f"and parallelise the same model")
    return entries


def _pieces(model_entries: Sequence[TensorPart], grid: Grid, prefer: int = 0) -> dict[str, list[_Piece]]:
    """For each tiled entry, the distinct parts the members of this rank's xyz group hold, each from member
    ``prefer`` when it holds it, else from the first member holding it (an all-gather of every member's tile
    geometry: ``[Gxyz, tensors, 2·ndim + 2]`` ints)."""
    tiled = [e for e in model_entries if e.tile is not None]
    ndim = max((len(e.dense_shape) for e in tiled), default=1)
    meta = torch.zeros(max(len(tiled), 1), 2 * ndim + 2, dtype=torch.int64)
    for i, e in enumerate(tiled):
        meta[i, : len(e.offsets)] = torch.tensor(e.offsets)
        meta[i, ndim: ndim + len(e.tile_shape)] = torch.tensor(e.tile_shape)
        meta[i, 2 * ndim:] = torch.tensor([e.tile.split_size, e.tile.split_index])
    every = grid.comm.all_gather(meta.to(grid.device), "xyz").cpu().tolist()      # [Gxyz][tensors][...]
    out: dict[str, list[_Piece]] = {}
    for i, e in enumerate(tiled):
        nd, seen, pieces = len(e.dense_shape), set(), []
        for r in [prefer] + [m for m in range(len(every)) if m != prefer]:
            row = every[r][i]
            p = _Piece(r, TileSpec(e.dense_shape, tuple(row[:nd]), tuple(row[ndim: ndim + nd]), e.tile.split_dim,
                                   row[2 * ndim], row[2 * ndim + 1], e.tile.row_map))   # one row map per tensor
            key = (p.tile.offsets, p.tile.tile_shape, p.tile.part_range())
            if key not in seen and p.numel:
                seen.add(key)
                pieces.append(p)
        covered = sum(p.numel for p in pieces)
        if covered != math.prod(e.dense_shape):
            raise ValueError(f"{e.name[len('model/'):]}: the ranks' tiles cover {covered} of "
                             f"{math.prod(e.dense_shape)} elements; its parameters' axgrid_tile marks are wrong")
        out[e.name] = pieces
    return out


def _own_piece(e: TensorPart) -> torch.Tensor:
    """This rank's real elements of its part, flat (its parameter without the split's zero padding)."""
    start, stop = e.tile.part_range()
    return e.tensor.detach().reshape(-1)[: stop - start]


def _rows_per_slab(shape: Sequence[int], element_size: int, chunk_bytes: int) -> int:
    """Dense rows (dim 0) per slab: as many as fit in ``chunk_bytes``, at least one."""
    return max(1, chunk_bytes // (math.prod(shape[1:]) * element_size or 1))


def _runs_in_rows(tile: TileSpec, r0: int, r1: int) -> list[tuple[int, int, list[Box]]]:
    """The pieces of ``tile``'s part in the dense rows ``[r0, r1)`` (:func:`axgrid.spec.tiles.row_segments`),
    joined into runs contiguous in the part: ``(first, stop, boxes)`` -- the part's elements ``[first, stop)``
    (counted from its first real element) fill ``boxes`` in order. One run per slab for a plain tile (its rows
    are contiguous in its flat order); a row-mapped (fused) tile may have one per band."""
    runs: list[tuple[int, int, list[Box]]] = []
    for pos, box in row_segments(tile, r0, r1):
        if runs and runs[-1][1] == pos:
            runs[-1] = (runs[-1][0], pos + box.numel, runs[-1][2] + [box])
        else:
            runs.append((pos, pos + box.numel, [box]))
    return runs


class _Scratch:
    """One reusable byte buffer per device, grown on demand and viewed as any dtype and shape: what the writing
    rank receives into (and, for the export, assembles slabs in) without allocating per message, so no freed
    buffers pile up in the heap (glibc keeps blocks below its mmap threshold, up to 32 MiB, resident)."""

    def __init__(self) -> None:
        self._bufs: dict[torch.device, torch.Tensor] = {}

    def view(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        n = math.prod(shape) * dtype.itemsize
        buf = self._bufs.get(device)
        if buf is None or buf.numel() < n:
            self._bufs.pop(device, None)
            buf = self._bufs[device] = torch.empty(n, dtype=torch.uint8, device=device)
        return buf[:n].view(dtype).view(tuple(shape))


def iter_dense_state_dict(model: nn.Module, grid: Grid, rank: int = 0, *, names: Optional[Sequence[str]] = None,
                          chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, dense tensor)`` for each entry of ``model.state_dict()`` (or of ``names``, in that order), on
    global rank ``rank`` only; the other ranks' iterators yield nothing. Collective: every rank must iterate it
    to the end, with the same ``names``.

    A tiled tensor is assembled on ``rank`` from the parts the ranks of its xyz group hold, in slabs of dense
    rows of at most ``chunk_bytes`` (at least one row): each member sends the piece of its part that falls in
    the slab, which is placed at its boxes (:func:`axgrid.spec.tiles.row_segments`); the other xyz groups (other ``d``)
    take no part. Only the tensor being yielded is alive in the iterator (plus one reused receive buffer of
    ``chunk_bytes``): drop it before asking for the next to keep the writing rank's extra memory at one tensor
    and one chunk. Tensors that are dense on every rank (norms under a Linear-only plan, tied weights, buffers)
    are yielded as the model's own tensors, not copies. Tensors are on the model's device.
    """
    if not 0 <= rank < grid.world_size:
        raise ValueError(f"iter_dense_state_dict: rank={rank} is not a rank of this grid (0..{grid.world_size - 1})")
    refuse_spread_experts(model, grid, "iter_dense_state_dict")
    keys = model.state_dict(keep_vars=True).keys()
    order = list(keys) if names is None else list(names)
    unknown = [n for n in order if n not in keys]
    if unknown:
        raise ValueError(f"iter_dense_state_dict: {unknown[0]!r} is not in the model's state_dict (names= must "
                         f"be a subset of its keys)")
    if chunk_bytes < 1:
        raise ValueError(f"iter_dense_state_dict: chunk_bytes={chunk_bytes} must be a positive number of bytes")
    return ((name, t) for name, _, t in _stream(model, grid, rank, order, chunk_bytes, whole=True))


def _stream(model: nn.Module, grid: Grid, rank: int, order: Sequence[str], chunk_bytes: int, whole: bool,
            remote: Optional[dict[str, tuple[str, int]]] = None) -> Iterator[tuple[str, int, torch.Tensor]]:
    """``(name, first row, rows)`` on ``rank``: with ``whole``, each tensor once (first row 0, the dense tensor);
    else each tiled tensor as consecutive slabs ``dense[r0 : r0 + len(rows)]`` assembled in a reused buffer,
    valid only until the next item (the writer's extra memory: one slab and one received piece), and each
    untiled tensor as one item, the model's own tensor. ``remote``: the experts ``rank`` does not hold (experts
    spread over ep > 1, :func:`expert_names`), each ``name -> (a name of the same shape here, the e-index holding
    it)``: that e-rank's xyz group assembles it on its member beside ``rank`` (the same x, y, z), which passes each
    slab to ``rank`` over ``"e"``."""
    remote = remote or {}
    entries = {e.name[len("model/"):]: e for e in _checked_entries(model, grid, "iter_dense_state_dict")}
    dst = grid.layout.index_in(rank, "xyz")
    writers = grid.layout.ep_group_of(rank)                     # the writer's e group: one rank per e-index
    mine = grid.layout.group_of(grid.rank, "xyz")[dst]          # this xyz group's member beside the writer
    if mine not in writers:
        return
    here, there = writers.index(mine), writers.index(rank)      # this group's e-index, the writer's
    me = grid.comm.indices["xyz"]
    pieces = _pieces(list(entries.values()), grid, prefer=dst)
    received, slabs = _Scratch(), _Scratch()
    for name in order:
        if name in remote:
            owner = remote[name][1]
        else:                                                  # held here: an expert of this e-rank, or shared
            owner = here if remote and _EXPERT_KEY.match(name) else there
        if owner != here:
            if grid.rank == rank:                              # the writer: the owner's slabs, over "e"
                like = entries[remote[name][0]]
                shape, dtype, device = tuple(like.dense_shape), like.tensor.dtype, like.tensor.device
                dense = torch.empty(shape, dtype=dtype, device=device) if whole else None
                for r0, r1 in _cuts(shape, like.tensor.element_size(), chunk_bytes):
                    rows = dense[r0:r1] if whole else slabs.view((r1 - r0, *shape[1:]), dtype, device)
                    grid.comm.recv(rows, "e", owner)
                    if not whole:
                        yield name, r0, rows
                if whole:
                    yield name, 0, dense
                    del dense
            continue
        for r0, rows in _assemble(entries[name], pieces, grid, me, dst, whole, received, slabs, chunk_bytes):
            if here == there:
                yield name, r0, rows
            else:                                              # an expert of this e-rank: on to the writer
                grid.comm.send(rows.contiguous(), "e", there)


def _cuts(shape: tuple[int, ...], element_size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """The row ranges of the slabs a tensor of ``shape`` streams in."""
    per = _rows_per_slab(shape, element_size, chunk_bytes)
    return [(r0, min(r0 + per, shape[0])) for r0 in range(0, shape[0], per)] or [(0, 0)]   # 0 rows: one slab


def _assemble(e: TensorPart, pieces: dict, grid: Grid, me: int, dst: int, whole: bool, received: "_Scratch",
              slabs: "_Scratch", chunk_bytes: int) -> Iterator[tuple[int, torch.Tensor]]:
    """On xyz member ``dst``: ``(first row, rows)`` of ``e``'s dense tensor, the whole (``whole``) or slab by slab,
    from the members' parts; the other members send theirs and yield nothing."""
    if e.tile is None:
        if me == dst:
            yield 0, e.tensor
        return
    shape, dtype, device = tuple(e.dense_shape), e.tensor.dtype, e.tensor.device
    cuts = _cuts(shape, e.tensor.element_size(), chunk_bytes)
    if me != dst:
        for p in pieces[e.name]:
            if p.src == me:
                own = _own_piece(e)
                for r0, r1 in cuts:
                    for s, t, _ in _runs_in_rows(p.tile, r0, r1):
                        grid.comm.send(own[s:t], "xyz", dst)
        return
    dense = torch.empty(shape, dtype=dtype, device=device) if whole else None
    for r0, r1 in cuts:
        rows = dense[r0:r1] if whole else slabs.view((r1 - r0, *shape[1:]), dtype, device)
        origin = (r0,) + (0,) * (len(shape) - 1)
        for p in pieces[e.name]:
            if p.src == me:
                place_part(e.tile, e.tensor, rows, origin)
                continue
            for s, t, boxes in _runs_in_rows(p.tile, r0, r1):
                got = grid.comm.recv(received.view((t - s,), dtype, device), "xyz", p.src)
                pos = 0
                for b in boxes:
                    rows[b.slices(origin)] = got[pos: pos + b.numel].view(b.shape)
                    pos += b.numel
        if not whole:
            yield r0, rows
    if whole:
        yield 0, dense


_EXPERT_KEY = re.compile(r"^(?P<block>.+)\.experts\.(?P<e>\d+)\.(?P<layer>[^.]+)\.weight$")


def expert_names(model: nn.Module) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """The state dict's names with every expert of each mixture-of-experts block in place of this rank's
    (``<block>.experts.<e>.<layer>.weight`` for ``e`` in ``0..E-1``; the same list on every rank), and the experts
    this rank does not hold: ``name -> (the name of this rank's first expert's same layer, the e-index holding it)``
    (experts ``j·E/ep .. (j+1)·E/ep - 1`` on e-index ``j``)."""
    sd = model.state_dict(keep_vars=True)
    names: list[str] = []
    remote: dict[str, tuple[str, int]] = {}
    done: set[str] = set()
    for n, t in sd.items():
        m = _EXPERT_KEY.match(n)
        if m is None or not getattr(t, "axgrid_expert", False):
            names.append(n)
            continue
        block = m["block"]
        if block in done:
            continue
        done.add(block)
        moe = model.get_submodule(block)
        local = [int(k) for k in moe.experts]
        layers = [k.rsplit(".", 1)[0] for k in moe.experts[str(local[0])].state_dict()]
        for e in range(moe.num_experts):
            for layer in layers:
                name = f"{block}.experts.{e}.{layer}.weight"
                names.append(name)
                if e not in local:
                    remote[name] = (f"{block}.experts.{local[0]}.{layer}.weight", e // len(local))
    return names, remote


def refuse_spread_experts(model: nn.Module, grid: Grid, what: str) -> None:
    """One line, before any collective, when ``model``'s experts are spread over the expert-parallel group (each
    d-rank holds others: a dense copy of them is not written yet)."""
    if grid.size("e") > 1 and any(getattr(p, "axgrid_expert", False) for p in model.parameters()):
        raise ValueError(f"{what}: the model's experts are spread over ep={grid.size('e')} ranks of d, whose dense "
                         f"export is not supported yet; export from a grid with ep=1 (from_pretrained loads onto any)")


def dense_state_dict(model: nn.Module, grid: Grid) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.state_dict()`` in its dense shape, on every rank (collective over the grid).

    For small models: every rank holds the whole dense model (use :func:`iter_dense_state_dict` otherwise).
    Each rank's part is all-gathered over the xyz group and placed (:func:`axgrid.io.place_part`); the others
    are copied.
    Tensors stay on their device.
    """
    refuse_spread_experts(model, grid, "dense_state_dict")
    entries = _checked_entries(model, grid, "dense_state_dict")
    pieces = _pieces(entries, grid)
    out: dict[str, torch.Tensor] = {}
    for e in entries:
        key = e.name[len("model/"):]
        if e.tile is None:
            out[key] = e.tensor.detach().clone()
            continue
        mine = _own_piece(e)
        big = max(p.numel for p in pieces[e.name])
        every = grid.comm.all_gather(torch.cat([mine, mine.new_zeros(big - mine.numel())]), "xyz")   # [Gxyz, big]
        dense = torch.empty(e.dense_shape, dtype=e.tensor.dtype, device=e.tensor.device)
        for p in pieces[e.name]:
            place_part(p.tile, every[p.src], dense)
        out[key] = dense
    return out


def _is_hf(model: nn.Module) -> bool:
    return callable(getattr(type(model), "save_pretrained", None)) and hasattr(model, "config")


def to_dense(model: nn.Module, grid: Grid) -> nn.Module:
    """A dense copy of a parallel model (collective; every rank gets one): for small models only, as every rank
    holds the whole dense model (export big ones with :func:`export_pretrained`). The original is untouched.

    A Hugging Face model is rebuilt from its config (``type(model)(model.config)``, tying what the config ties)
    and loaded with the dense tensors, whatever plan parallelised it. Any other model is deep-copied with each
    ``axgrid.nn.Linear`` turned back into the ``nn.Linear`` it stands for (tied weights stay tied: they were
    never parallelised); if it holds other parallel modules (axgrid's Embedding/LayerNorm/RMSNorm) this raises
    before any collective: use :func:`dense_state_dict` for those."""
    grid.runtime.dp.finish()                 # zero >= 1 with ODP: the parameters' last all-gathers
    if _is_hf(model):
        state = dense_state_dict(model, grid)
        fresh = type(model)(model.config)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        fresh.to(device=grid.device, dtype=dtype)
        fresh.load_state_dict(state)
        return fresh.train(model.training)
    for name, mod in model.named_modules():
        if not isinstance(mod, Linear) and any(getattr(p, "axgrid_tile", None) is not None
                                               for p in mod._parameters.values() if p is not None):
            raise TypeError(f"to_dense: {name or 'the model'} ({type(mod).__name__}) holds parallel parameters but "
                            f"has no dense nn.Module counterpart; use axgrid.dense_state_dict(model, grid), or "
                            f"load an axgrid.checkpoint into a serial model (grid=None)")
    state = dense_state_dict(model, grid)
    dense = copy.deepcopy(model)
    for attr in ("save_pretrained", "axgrid_summary"):          # set on the instance by parallelize
        dense.__dict__.pop(attr, None)
    made: dict[int, nn.Linear] = {}
    for path, mod in list(dense.named_modules(remove_duplicate=False)):
        if not isinstance(mod, Linear):
            continue
        if id(mod) not in made:
            made[id(mod)] = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                                      dtype=mod.weight.dtype, device=mod.weight.device)
            for p, q in ((made[id(mod)].weight, mod.weight), (made[id(mod)].bias, mod.bias)):
                if p is not None:
                    p.requires_grad_(q.requires_grad)
        if path:                                                     # (the root itself: below)
            parent = dense.get_submodule(path.rsplit(".", 1)[0]) if "." in path else dense
            setattr(parent, path.rsplit(".", 1)[-1], made[id(mod)])
    if isinstance(dense, Linear):
        dense = made[id(dense)]
    dense.load_state_dict(state)
    return dense


#: Files of a Hugging Face tokenizer, copied from the model's local source directory by export_pretrained.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
_SHARD_FILE = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors(\.tmp)?$")


def _shard_plan(model: nn.Module, grid: Grid, max_shard_size: int | str) -> tuple[dict[str, list[str]], dict]:
    """Hugging Face's file layout for the dense model: ``{file: [tensor names]}`` and the index's metadata.

    The names are the state dict's minus tied duplicates (transformers' own rule); the files are cut by
    huggingface_hub's splitter from the dense sizes, so the layout is save_pretrained's, with no tensor built."""
    from huggingface_hub import split_state_dict_into_shards_factory
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    local = model.state_dict()
    for name in getattr(model, "_keys_to_ignore_on_save", None) or ():
        local.pop(name, None)
    kept = remove_tied_weights_from_state_dict(local, model)
    names, remote = expert_names(model)
    sd = model.state_dict(keep_vars=True)
    like = {n: sd[remote[n][0]] if n in remote else sd[n] for n in names}
    kept = set(kept) | set(remote)
    dense = {n: torch.empty(tuple(t.axgrid_tile.dense_shape) if getattr(t, "axgrid_tile", None) else t.shape,
                            dtype=t.dtype, device="meta") for n, t in like.items() if n in kept}
    split = split_state_dict_into_shards_factory(dense, get_storage_size=lambda t: t.numel() * t.element_size(),
                                                 filename_pattern="model{suffix}.safetensors",
                                                 max_shard_size=max_shard_size)
    params = {n for n, _ in model.named_parameters()}
    meta = {"total_parameters": sum(t.numel() for n, t in dense.items() if n in params), **split.metadata}
    return {f: list(names) for f, names in split.filename_to_tensors.items()}, meta


def export_pretrained(model: nn.Module, save_directory: str, grid: Grid, *, rank: int = 0,
                      max_shard_size: int | str = "50GB", tokenizer: Any = None,
                      chunk_bytes: int = CHUNK_BYTES) -> str:
    """Write a parallelised Hugging Face model as a dense HF checkpoint that ``from_pretrained`` (transformers'
    or :func:`axgrid.from_pretrained`) loads: safetensors files of at most ``max_shard_size`` each (default and
    naming as transformers' ``save_pretrained``; ``model.safetensors.index.json`` when there are several), the
    config, the generation config if the model generates, and the tokenizer (``tokenizer.save_pretrained``, or
    the tokenizer files of the model's local source directory). Returns ``save_directory``.

    Collective: every rank calls it; global rank ``rank`` writes. Streamed: each tensor is assembled on ``rank``
    in slabs of dense rows of at most ``chunk_bytes`` (at least one row), each written into its file as soon as
    it is complete, so the writing rank's extra memory is one slab and one received piece (two reused buffers
    of ``chunk_bytes``, or of one row if a row is bigger; the file's bytes go to the OS as they are written),
    whatever the size of the tensor (a tensor held whole, such as a norm, is written from the model itself,
    through a host copy when on a GPU), and the other ranks hold only their own parts. A failure on the writing
    rank is raised on every rank; the files are written under a temporary name and renamed when complete, so a
    failed export leaves no half-written file under a final name. A mixture of experts spread over ep > 1
    (each e-rank holding others) writes every expert: an e-rank's xyz group assembles its experts on its member
    beside ``rank``, which passes them on over ``"e"`` slab by slab. A tensor whose parameter carries
    ``axgrid_export_name`` is written under that name (a Mixtral's experts and router: its files' legacy names).
    """
    if getattr(model, "axgrid_lora", None) is not None:
        raise ValueError("export_pretrained: the model carries LoRA adapters; fold them in first "
                         "(axgrid.merge_lora(model)) or write them alone (axgrid.save_adapter)")
    if not _is_hf(model):
        raise TypeError(f"export_pretrained: {type(model).__name__} is not a Hugging Face model (no "
                        f"save_pretrained); use axgrid.to_dense(model, grid) or axgrid.dense_state_dict(model, grid)")
    if not 0 <= rank < grid.world_size:
        raise ValueError(f"export_pretrained: rank={rank} is not a rank of this grid (0..{grid.world_size - 1})")
    if chunk_bytes < 1:
        raise ValueError(f"export_pretrained: chunk_bytes={chunk_bytes} must be a positive number of bytes")
    files, index_meta = _shard_plan(model, grid, max_shard_size)
    names, remote = expert_names(model)
    sd = model.state_dict(keep_vars=True)
    rename = {n: _renamed(n, sd, remote) for n in names}
    writer_rank = grid.rank == rank
    err: Optional[BaseException] = None
    if writer_rank:
        try:
            _write_side_files(model, save_directory, tokenizer)
        except Exception as ex:  # reported on every rank below, before any tensor moves
            err = ex
    raise_on_any_rank(grid, err, lambda n: RuntimeError(
        f"export_pretrained: rank {rank} could not write {save_directory} (see its error)"))
    layout = {n: f for f, names in files.items() for n in names}
    like = {n: sd[remote[n][0]] if n in remote else sd[n] for n in names}
    shapes = {n: (t.dtype, tuple(t.axgrid_tile.dense_shape) if getattr(t, "axgrid_tile", None) else tuple(t.shape))
              for n, t in like.items() if n in layout}
    current: Optional[SafetensorsWriter] = None
    current_names: set[str] = set()
    try:
        for name, row, rows in _stream(model, grid, rank, [n for n in names if n in layout], chunk_bytes,
                                       whole=False, remote=remote):
            if err is not None:
                continue                              # keep receiving: the other ranks are sending
            try:
                if name not in current_names:
                    if current is not None:
                        current.close()
                    current_names = set(files[layout[name]])
                    current = SafetensorsWriter(os.path.join(save_directory, layout[name]),
                                                [(rename[n], *shapes[n]) for n in files[layout[name]]],
                                                {"format": "pt"})
                current.write_rows(rename[name], row, rows)
            except Exception as ex:
                err = ex
                if current is not None:
                    current.abort()
            del rows
    except ValueError as ex:      # the stream's own check (tiles that do not cover a tensor): raised by the whole
        err = err or ex           # xyz group at once, so the ranks outside it must hear of it below
        if current is not None:
            current.abort()
    if writer_rank and err is None:
        try:
            if current is not None:
                current.close()
            _finish_index(save_directory, {f: [rename[n] for n in names] for f, names in files.items()}, index_meta)
        except Exception as ex:
            err = ex
    raise_on_any_rank(grid, err, lambda n: RuntimeError(
        f"export_pretrained: rank {rank} could not write {save_directory} (see its error)"))
    return save_directory


def _renamed(name: str, sd: dict, remote: dict[str, tuple[str, int]]) -> str:
    """The name ``name`` is written under: its parameter's ``axgrid_export_name`` (for an expert held by another
    e-rank, that of this rank's same layer with the expert's index put in)."""
    if name not in remote:
        return getattr(sd[name], "axgrid_export_name", name)
    template = remote[name][0]
    out = getattr(sd[template], "axgrid_export_name", None)
    if out is None:
        return name
    e_here, e_there = template.split(".experts.")[1].split(".")[0], name.split(".experts.")[1].split(".")[0]
    return out.replace(f".experts.{e_here}.", f".experts.{e_there}.")


def _write_side_files(model: nn.Module, save_directory: str, tokenizer: Any) -> None:
    """The writing rank, before any tensor: the directory, config, generation config and tokenizer."""
    if os.path.exists(save_directory) and not os.path.isdir(save_directory):
        raise NotADirectoryError(f"export_pretrained: {save_directory} is a file; pass a directory to write into")
    os.makedirs(save_directory, exist_ok=True)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    model.config.dtype = str(dtype).replace("torch.", "")          # as save_pretrained records them
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(save_directory)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(save_directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(save_directory)
        return
    source = getattr(model, "name_or_path", "") or ""
    if os.path.isdir(source) and os.path.abspath(source) != os.path.abspath(save_directory):
        for fname in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(source, fname)):
                shutil.copyfile(os.path.join(source, fname), os.path.join(save_directory, fname))


def _finish_index(save_directory: str, files: dict[str, list[str]], meta: dict) -> None:
    """The index of a sharded export (none for one file), and the weight files of an earlier export removed."""
    index = os.path.join(save_directory, "model.safetensors.index.json")
    if len(files) > 1:
        weight_map = {n: f for f, names in files.items() for n in names}
        with open(index + ".tmp", "w") as f:
            json.dump({"metadata": meta, "weight_map": weight_map}, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(index + ".tmp", index)
    elif os.path.exists(index):
        os.remove(index)
    for fname in os.listdir(save_directory):
        if _SHARD_FILE.match(fname) and fname not in files:
            os.remove(os.path.join(save_directory, fname))


def _refuse_save_pretrained(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("save_pretrained on a model parallelised by axgrid would write each rank's 1-D shards "
                       "under the dense names (from_pretrained then fails): call "
                       "axgrid.export_pretrained(model, save_directory, grid) on every rank instead")


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` (and ``push_to_hub``, which calls it) refuse with the way out."""
    if callable(getattr(model, "save_pretrained", None)):
        model.__dict__["save_pretrained"] = _refuse_save_pretrained
