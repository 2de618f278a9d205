"""``axgrid.from_pretrained``: a Hugging Face checkpoint straight into a parallel model, no dense copy anywhere.

    grid = axgrid.init("2x2x1x1")
    model = axgrid.from_pretrained("path/to/llama", grid, torch_dtype=torch.bfloat16)
    model.axgrid_load_report        # LoadReport: files, tensors, bytes this rank read, seconds

1. The model is built from its ``config.json`` with its parameters on the meta device (buffers computed at
   construction, such as rotary ``inv_freq``, are real: :func:`axgrid.io.meta.parameters_on_meta`).
2. The plan is applied on that empty model (:func:`axgrid.parallelize`: the built-in plan of its family, the
   given ``plan``, or drop-in): the parallel layers hold uninitialised parts, the dense leftovers stay on meta.
3. Every rank checks the files and every tensor it needs (present, shape, dtype), then agrees with the others
   (one all-reduce) before reading anything: bad input raises the same :class:`PretrainedError` on every rank.
4. Each rank reads, per tensor, only the boxes of its part (:func:`axgrid.spec.tiles.part_boxes`) with
   ``safe_open(...).get_slice``; tensors without a tile (drop-in norms and embeddings) are read whole. A tied
   parameter is one tensor read once, under whichever of its names the files hold; files whose head and
   embedding disagree with the config's ``tie_word_embeddings`` are refused (a separate head for a tied config,
   none for an untied one).
   A failure while reading is agreed on too: the model is returned complete or not at all.
5. A ``generation_config.json`` in the folder becomes the model's generation config, as in transformers (the
   defaults of ``generate`` and :func:`axgrid.generate`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import nn

from ..core.grid import Grid
from ..plans.parallelize import parallelize
from .hf_files import DTYPES, HFCheckpoint, PretrainedError
from .meta import materialize, parameters_on_meta
from .parts import raise_on_any_rank
from ..spec import TileSpec
from ..spec.tiles import Box, part_boxes, part_shape
from .part_copy import read_part, tile_of


@dataclass
class LoadReport:
    """What :func:`from_pretrained` read on this rank (``model.axgrid_load_report``)."""

    path: str
    files: list[str]                 # the weight files opened
    tensors: int                     # distinct tensors read (parameters and persistent buffers)
    bytes_read: int                  # tensor bytes read from the files, in their dtype
    seconds: float                   # wall time of the whole load on this rank
    plan: str                        # the TransformerPlan's name, or "drop-in"


@dataclass
class _Read:
    """One distinct tensor of the model to fill from the checkpoint."""

    tensor: torch.Tensor             # the parameter or buffer (meta: a dense leftover; else a parallel part)
    owner: nn.Module                 # the module holding it directly (for buffers)
    attr: str
    key: str                         # its name in the files
    is_param: bool
    file_dtype: torch.dtype          # its dtype in the files


def _config(path: str, overrides: dict[str, Any]):
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(path, **overrides)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PretrainedError(f"{path}/config.json cannot be read as a transformers config ({type(e).__name__}: "
                              f"{e}); pass the folder save_pretrained wrote") from None


def _model_class(config) -> type:
    import transformers
    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and issubclass(cls, nn.Module):
            return cls
    try:
        return transformers.AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        raise PretrainedError(f"config.json names architectures {getattr(config, 'architectures', None)} and "
                              f"model_type {config.model_type!r}, which transformers cannot build as a causal "
                              f"LM; build the model yourself and use axgrid.parallelize") from None


def _read_generation_config(path: str, model: nn.Module) -> None:
    """Give ``model`` the folder's ``generation_config.json`` when it has one, as transformers' ``from_pretrained``
    does (``generate``'s defaults, e.g. an instruct model's end-of-turn EOS ids); without one the model keeps the
    generation config it built from its config."""
    if not os.path.isfile(os.path.join(path, "generation_config.json")) or not model.can_generate():
        return
    from transformers import GenerationConfig
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{path}/generation_config.json cannot be read as a transformers generation config "
                              f"({type(e).__name__}: {e}); fix or remove it") from None


def _dtype(torch_dtype: Union[None, str, torch.dtype], config, ck: HFCheckpoint) -> torch.dtype:
    """``torch_dtype``, else (as transformers' ``dtype="auto"``) the config's, else the files' first float."""
    for choice in (torch_dtype, getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)):
        if choice is None or choice == "auto":
            continue
        dt = getattr(torch, choice, None) if isinstance(choice, str) else choice
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            raise PretrainedError(f"torch_dtype={choice!r} is not a floating-point torch dtype; pass e.g. "
                                  f"torch.bfloat16 or 'float32'")
        return dt
    for name in sorted(ck.weight_map)[:8]:
        dt = DTYPES.get(ck.describe(name)[2])
        if dt is not None and dt.is_floating_point:
            return dt
    return torch.float32


def _reads(model: nn.Module, ck: HFCheckpoint) -> list[_Read]:
    """Every distinct parameter and persistent buffer, with the file tensor it is read from; checks shapes and
    dtypes against the files' headers (no data read)."""
    owners: dict[int, tuple[nn.Module, str, bool]] = {}
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for attr, t in mod._parameters.items():
            if t is not None:
                owners.setdefault(id(t), (mod, attr, True))
                tensors[id(t)] = t
                names.setdefault(id(t), []).append(f"{mname}.{attr}" if mname else attr)
        for attr, t in mod._buffers.items():
            if t is not None and attr not in mod._non_persistent_buffers_set:
                owners.setdefault(id(t), (mod, attr, False))
                tensors[id(t)] = t
                names.setdefault(id(t), []).append(f"{mname}.{attr}" if mname else attr)
    prefix = getattr(model, "base_model_prefix", "") or ""
    out = []
    for tid, t in tensors.items():
        mod, attr, is_param = owners[tid]
        cands = list(dict.fromkeys(names[tid] + getattr(t, "axgrid_file_names", [])))   # a plan's other names
        if prefix:
            cands += [f"{prefix}.{n}" for n in cands] + [n[len(prefix) + 1:] for n in cands
                                                         if n.startswith(prefix + ".")]
        key = ck.find(cands)
        found = [n for n in dict.fromkeys(cands) if n in ck.weight_map]
        if len(names[tid]) > 1 and len(found) > 1:
            raise PretrainedError(f"config.json of {ck.path} ties {' and '.join(dict.fromkeys(names[tid]))} into one "
                                  f"tensor (tie_word_embeddings={_tied(model)}), but the files hold a separate "
                                  f"{found[1]}: set \"tie_word_embeddings\": false in config.json to load both, or "
                                  f"remove {found[1]} from the files")
        if key is None and is_param and _tied(model) is False and _is_output_embedding(model, t):
            emb = _input_embedding_key(model, ck)
            if emb is not None:
                raise PretrainedError(f"config.json of {ck.path} says tie_word_embeddings=false, but the files hold "
                                      f"no {names[tid][0]}, only {emb} (a tied checkpoint): set "
                                      f"\"tie_word_embeddings\": true in config.json")
        if key is None:
            if not is_param and t.device.type != "meta":
                continue                          # a buffer the model computed itself
            raise PretrainedError(f"{names[tid][0]} (shape {tuple(_dense_shape(t))}) is in none of the weight "
                                  f"files of {ck.path}: the checkpoint does not match its config.json (or a "
                                  f"config override changed the model); use the checkpoint's own config")
        fname, shape, st_dtype = ck.describe(key)
        want = _dense_shape(t)
        if shape != want:
            raise PretrainedError(f"{key} in {ck.path}/{fname} has shape {list(shape)}, but the config gives "
                                  f"{list(want)}: config.json does not match the weights (or a config override "
                                  f"changed a size); use the checkpoint's own config")
        dt = DTYPES.get(st_dtype)
        if dt is None or dt.is_floating_point != t.is_floating_point() or (not dt.is_floating_point and dt != t.dtype):
            raise PretrainedError(f"{key} in {ck.path}/{fname} is {st_dtype}, but the model's {names[tid][0]} is "
                                  f"{str(t.dtype).replace('torch.', '')}: the file holds another kind of tensor; "
                                  f"re-save the checkpoint from the model of this config")
        out.append(_Read(t, mod, attr, key, is_param, dt))
    return out


def _tied(model: nn.Module) -> Optional[bool]:
    """The config's ``tie_word_embeddings`` (None when it has none)."""
    value = getattr(getattr(model, "config", None), "tie_word_embeddings", None)
    return None if value is None else bool(value)


def _is_output_embedding(model: nn.Module, t: torch.Tensor) -> bool:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head is not None and getattr(head, "weight", None) is t


def _input_embedding_key(model: nn.Module, ck: HFCheckpoint) -> Optional[str]:
    """The files' name of the input embedding's weight, when they hold it."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    names = [f"{n}.weight" for n, m in model.named_modules() if m is emb]
    prefix = getattr(model, "base_model_prefix", "") or ""
    names += [n[len(prefix) + 1:] for n in names if prefix and n.startswith(prefix + ".")]
    return ck.find(names)


def _dense_shape(t: torch.Tensor) -> tuple[int, ...]:
    tile = tile_of(t)
    return tuple(tile.dense_shape) if tile is not None else tuple(t.shape)


def _fill(r: _Read, ck: HFCheckpoint, device: torch.device) -> None:
    """Read this rank's part of ``r`` (its boxes only) and put it in place."""
    t = r.tensor
    shape = tuple(t.shape)
    tile = tile_of(t) or TileSpec(shape, (0,) * len(shape), shape)        # no tile: the whole tensor

    def read(box: Box) -> torch.Tensor:
        return ck.read(r.key, box)

    with torch.no_grad():
        boxes = part_boxes(tile)
        if r.is_param and len(boxes) == 1 and boxes[0].numel == t.numel() and r.file_dtype == t.dtype:
            # one box, no padding, no cast: the tensor read becomes the parameter's data, copied once out of the
            # file's mapping (safetensors' slices are views of it), never twice, and nothing temporary is
            # allocated between the kept tensors (a cast copies into the parameter below: no temporary either)
            data = read(boxes[0]).to(device=device)
            st = data.untyped_storage()
            if not st.resizable() or st.nbytes() != data.numel() * data.element_size():
                data = data.clone(memory_format=torch.contiguous_format)   # a view of the file's mapping: copy
            data = data.reshape(part_shape(tile))
            if t.device.type == "meta":
                materialize(t, data)
            else:
                t.data = data
            return
        if r.is_param and t.device.type != "meta":      # a parallel layer's uninitialised part: filled in place
            read_part(tile, read, out=t)
            return
        data = read_part(tile, read, dtype=t.dtype, device=device).view(shape)
        if r.is_param:
            materialize(t, data)                  # a dense leftover: the same Parameter object, now with data
        else:
            r.owner._buffers[r.attr] = data


def from_pretrained(path: str, grid: Grid, *, torch_dtype: Union[None, str, torch.dtype] = None,
                    device: Union[None, str, torch.device] = None, plan: Any = None,
                    **config_overrides: Any) -> nn.Module:
    """The Hugging Face checkpoint at ``path`` (a ``save_pretrained`` folder, single-file or sharded) as a model
    parallelised on ``grid``, each rank reading only its own parts from the safetensors files.

    Equals ``axgrid.parallelize(AutoModelForCausalLM.from_pretrained(path), grid, plan)`` (in eval mode, like
    transformers). ``torch_dtype``: the parameters' dtype (default: the config's, as transformers' ``"auto"``).
    ``device``: must be the grid's (the default). ``plan``: as :func:`axgrid.parallelize` (None: the built-in
    plan when the model has one, else drop-in; ``{}``: drop-in). ``config_overrides`` go to ``AutoConfig``.
    Collective: every rank calls it; bad input raises :class:`PretrainedError` (or the plan's ValueError) on
    every rank and returns no model. ``model.axgrid_load_report`` is this rank's :class:`LoadReport`.
    """
    t0 = time.perf_counter()
    err: Optional[Exception] = None
    model: Optional[nn.Module] = None
    reads: list[_Read] = []
    ck: Optional[HFCheckpoint] = None
    try:
        want = torch.device(device) if device is not None else grid.device
        if want.type != grid.device.type or want.index not in (None, grid.device.index):
            raise PretrainedError(f"device={device!r} differs from the grid's device {grid.device}: the parts go "
                                  f"where the grid computes; leave device unset or init the grid on {device}")
        ck = HFCheckpoint(path, "cpu")           # read from the files on the host; each part goes to the device once
        config = _config(path, config_overrides)
        cls = _model_class(config)
        dtype = _dtype(torch_dtype, config, ck)
        ck.open_all()
        ck.close()
        with parameters_on_meta():
            model = cls._from_config(config, dtype=dtype)
        _read_generation_config(path, model)
        parallelize(model, grid, plan)
        reads = _reads(model, ck)
    except (PretrainedError, ValueError, OSError) as e:
        err = e
    raise_on_any_rank(grid, err, lambda n: PretrainedError(
        f"{n} rank(s) could not load {path} (see their errors); no model was built"))
    assert model is not None and ck is not None
    try:
        for r in reads:
            _fill(r, ck, grid.device)
            ck.release(r.key)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
        if left:
            raise PretrainedError(f"{left[:4]} were not in {path} and stay empty: the checkpoint does not match "
                                  f"the model; re-save it from a model of this config")
        for mod in model.modules():               # buffers computed at construction, on the grid's device
            for attr, b in mod._buffers.items():
                if b is not None and b.device != grid.device:
                    mod._buffers[attr] = b.to(grid.device)
    except Exception as e:  # an I/O or safetensors error on this rank: every rank must still agree below
        err = e if isinstance(e, PretrainedError) else PretrainedError(
            f"reading {path} failed on rank {grid.rank} ({type(e).__name__}: {e}); check the files (copy or save "
            f"them again)")
    raise_on_any_rank(grid, err, lambda n: PretrainedError(
        f"{n} rank(s) failed reading {path} (see their errors); no model was returned"))
    summary = getattr(model, "axgrid_plan", None)
    model.__dict__["axgrid_load_report"] = LoadReport(
        path, ck.files_opened, len(reads), ck.bytes_read, time.perf_counter() - t0,
        summary.name if summary is not None else "drop-in")
    ck.close()
    return model.eval()
