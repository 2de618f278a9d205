"""What installing and importing axgrid brings: a lazy top-level package, and only the import name `axgrid`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_import_axgrid_and_layout_loads_no_torch():
    _run("import sys, axgrid, axgrid.layout; from axgrid import GridShape, GridError, Layout; "
         "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'axgrid.grid'))); "
         "assert not bad, bad; assert axgrid.__version__")


def test_every_public_name_loads_on_first_use():
    _run("import types, axgrid, axgrid.plans, axgrid.parallelize as p\n"
         "for name in axgrid.__all__: assert getattr(axgrid, name) is not None, name\n"
         "assert set(axgrid.__all__) <= set(dir(axgrid))\n"
         # the submodule axgrid.parallelize (imported by axgrid.plans) does not hide the function of that name
         "assert callable(axgrid.parallelize) and not isinstance(axgrid.parallelize, types.ModuleType)\n"
         "assert p is axgrid.parallelize\n"
         "from axgrid import init, nn, Grid; assert nn.Linear is axgrid.nn.Linear and Grid is axgrid.Grid\n"
         "assert axgrid.models.gpt.GPT is axgrid.models.GPT\n"
         "assert not hasattr(axgrid, 'no_such_name')")
