"""``python -m axgrid.checkpoint PATH``: verify a checkpoint and summarise it."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from .format import CheckpointError
from .store import resolve_checkpoint, verify_checkpoint

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
    if man.get("config"):
        print("  run config: " + ", ".join(f"{k}={v}" for k, v in man["config"].items()))
    for name, t in man["tensors"].items():
        print(f"  {name:<48} {t['dtype']:<9} {str(tuple(t['dense_shape'])):<16} {len(t['tiles'])} tile(s)")
    return 0


if __name__ == "__main__":
    from ..launch.errors import run
    run(_main, "axgrid.checkpoint")
