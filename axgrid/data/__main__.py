"""``python -m axgrid.data preprocess``: a corpus (JSONL, ``.jsonl.gz``, ``.jsonl.zst`` or plain text) to
Megatron's indexed dataset ``PREFIX.bin`` / ``PREFIX.idx`` (see :mod:`axgrid.data.preprocess`).

    python -m axgrid.data preprocess --input corpus/*.jsonl.zst --json-key text --tokenizer HF_FOLDER \\
        --out data/corpus --workers 8 --append-eod
    python -m axgrid.data preprocess --input book.txt --tokenizer bytes --out data/book

Then train on it: ``train_gpt.py --data-path data/corpus --split 949,50,1`` (docs/data.md).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .indexed import DataError
from .preprocess import PreprocessError, PreprocessSettings, Progress, preprocess


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m axgrid.data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preprocess", help="tokenize a corpus into PREFIX.bin and PREFIX.idx")
    pre.add_argument("--input", nargs="+", required=True, metavar="FILE",
                     help=".jsonl/.json (one object per line), optionally .gz or .zst; any other file is plain text "
                          "(one document per file)")
    pre.add_argument("--json-key", default="text", help="the key of each JSON line that holds the document")
    pre.add_argument("--tokenizer", default="bytes", metavar="HF_FOLDER|bytes",
                     help="a Hugging Face tokenizer folder (its fast tokenizer), or bytes (UTF-8, vocabulary 256)")
    pre.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.bin and PREFIX.idx")
    pre.add_argument("--workers", type=int, default=1, help="tokenizing worker processes")
    pre.add_argument("--append-eod", action="store_true", help="append the tokenizer's eos id to every document")
    pre.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                     help="a corrupt line stops preprocessing (fail) or is left out and reported (skip)")
    pre.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    a = p.parse_args(list(argv) if argv is not None else None)
    settings = PreprocessSettings(inputs=a.input, out=a.out, tokenizer=a.tokenizer, json_key=a.json_key,
                                  workers=a.workers, append_eod=a.append_eod, on_error=a.on_error)
    progress = Progress(sys.stderr, bar=False, every_s=0) if a.no_progress else None
    try:
        report = preprocess(settings, progress)
    except (PreprocessError, DataError) as e:
        print(f"preprocess: {e}", file=sys.stderr)
        return 2
    print(report.line(), flush=True)
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "python -m axgrid.data")     # errors said once, as one line (axgrid.launch.errors)
