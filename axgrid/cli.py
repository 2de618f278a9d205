"""The ``axgrid`` command: ``launch`` ranks locally, ``describe`` a grid's layout, run the ``demo``, ``dryrun`` one rank
of a job of any size (:mod:`axgrid.dryrun`).

Errors in the command's input are one line and a non-zero exit (:mod:`axgrid.launch.errors`); ``--debug`` (or
``AXGRID_DEBUG=1``) prints tracebacks instead, here and in the ranks ``axgrid launch`` starts."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .spec.layout import GridError, GridShape, RankLayout


def _describe(args: argparse.Namespace) -> int:
    try:
        if args.gpus_per_node is not None and args.gpus_per_node < 1:
            raise GridError(f"--gpus-per-node {args.gpus_per_node} must be >= 1 (or left out: one node)")
        shape = GridShape.parse(args.grid, args.world)
        layout = RankLayout(shape, args.order)
    except GridError as e:
        print(f"axgrid describe: {e}", file=sys.stderr)
        return 2
    per_node = args.gpus_per_node or shape.size
    print(f"grid {shape} (Gx x Gy x Gz x Gdata), order {args.order!r}, {shape.size} ranks, "
          f"{per_node} per node ({-(-shape.size // per_node)} node(s))")
    print("\n".join(layout.describe([r // per_node for r in range(shape.size)])))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command with ``argv`` (None: the command line, with its errors said once, then exit)."""
    if argv is None:
        from .launch.errors import run
        run(_main, "axgrid")
    return _main(list(argv))


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="axgrid", description="4D hybrid tensor parallelism on a virtual grid. Errors "
                                 "in the input are one line; --debug (before any --) or AXGRID_DEBUG=1 prints "
                                 "tracebacks, in the ranks of `axgrid launch` too.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("launch", help="start N ranks of a command on this machine")
    p.add_argument("-n", "--ranks", type=int, required=True)
    p.add_argument("--no-mpi", action="store_true", help="use the plain process launcher even if mpiexec exists")
    p.add_argument("--timeout", type=float, default=None, help="end the whole job after this many seconds")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds the ranks get to exit after a forwarded SIGTERM/SIGHUP/SIGINT before SIGKILL")
    p.add_argument("--run-dir", default=None,
                   help="the run's directory (AXGRID_RUN_DIR): flight records of a failed job go to RUN_DIR/flight")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    d = sub.add_parser("describe", help="print which ranks form each group of a grid")
    d.add_argument("grid", help="e.g. 2x2x2x1")
    d.add_argument("--world", type=int, default=None, help="world size (to infer Gdata from a 3-size grid)")
    d.add_argument("--order", default="xyzd")
    d.add_argument("--gpus-per-node", type=int, default=None)
    m = sub.add_parser("demo", help="the main job: train an MLP stack 3D-parallel, check it against serial")
    m.add_argument("-n", "--ranks", type=int, default=8)
    m.add_argument("rest", nargs=argparse.REMAINDER, help="options for python -m axgrid.demo")
    r = sub.add_parser("dryrun", help="one rank of a job of any size, its real step on this machine, against "
                       "perfmodel (python -m axgrid.dryrun --help)", add_help=False)
    r.add_argument("rest", nargs=argparse.REMAINDER, help="options for python -m axgrid.dryrun")
    args, extra = ap.parse_known_args(argv)
    if args.command == "dryrun":
        from .dryrun.cli import main as dryrun
        return dryrun([*extra, *args.rest], prog="axgrid dryrun")
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "launch":
        from .launch.local import launch
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return launch(args.ranks, cmd, use_mpi=False if args.no_mpi else None, timeout_s=args.timeout,
                      grace_s=args.grace, run_dir=args.run_dir)
    if args.command == "describe":
        return _describe(args)
    if args.command == "demo":
        from .launch.local import launch
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        return launch(args.ranks, [sys.executable, "-m", "axgrid.demo", *rest])
    return 2


if __name__ == "__main__":
    from .launch.errors import run
    run(_main, "axgrid")
