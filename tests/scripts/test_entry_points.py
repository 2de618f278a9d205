"""Every entry point goes through the one error path (axgrid.launch.errors.run), found by globbing, so a new script
is held to it as it is written: the scripts of experiments/ and examples/, the ``python -m`` modules and the
``axgrid`` command. Each one's ``if __name__ == "__main__":`` block ends with ``run(MAIN, PROG)``, and MAIN given
one bad argument says one line, no traceback, with a non-zero exit. And the case that printed a traceback from
every rank: memory_check.py under ``axgrid launch -n 4`` with a batch that does not split."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from axgrid.launch import errors
from axgrid.launch.env import LAUNCH_DIR_VAR

from helpers import ROOT

BAD = ["--no-such-option-38"]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                 "SLURM_NTASKS", LAUNCH_DIR_VAR, errors.DEBUG_VAR)


def _main_guard(tree: ast.Module) -> ast.If | None:
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__"):
            return node
    return None


def entry_points() -> list[Path]:
    """Every file with an ``if __name__ == "__main__":`` block, in experiments/, examples/ and axgrid/, and every
    package's ``__main__.py`` (``python -m``)."""
    files = [*ROOT.glob("experiments/**/*.py"), *ROOT.glob("examples/*.py"), *ROOT.glob("axgrid/**/*.py")]
    return sorted(f for f in files if f.name == "__main__.py" or ('if __name__ == "__main__"' in f.read_text()
                                                                  and _main_guard(ast.parse(f.read_text()))))


def _run_call(path: Path) -> tuple[str, str]:
    """(MAIN, PROG) of the ``run(MAIN, PROG)`` that ends the entry point's main block (a ``__main__.py``: the
    module)."""
    tree = ast.parse(path.read_text())
    guard = _main_guard(tree)
    last = (guard.body if guard is not None else tree.body)[-1]
    call = last.value if isinstance(last, ast.Expr) else None
    ok = isinstance(call, ast.Call) and ast.unparse(call.func) in ("run", "errors.run") and len(call.args) == 2
    assert ok, f"{path.relative_to(ROOT)}: its main block must end with run(main, PROG) (axgrid.launch.errors), " \
               f"not {ast.unparse(last)}"
    return ast.unparse(call.args[0]), ast.literal_eval(call.args[1])


def _load(path: Path, main_name: str, monkeypatch):
    """The entry point as a module, its main block not run (a ``__main__.py`` that calls ``run`` unguarded: the
    module it imports MAIN from)."""
    rel = path.relative_to(ROOT)
    tree = ast.parse(path.read_text())
    if path.name == "__main__.py" and _main_guard(tree) is None:
        for node in tree.body:          # from .cli import main  ->  axgrid.<package>.cli
            if isinstance(node, ast.ImportFrom) and node.level == 1 and main_name in [a.name for a in node.names]:
                return importlib.import_module(".".join([*rel.parent.parts, node.module]))
    if rel.parts[0] == "axgrid":
        return importlib.import_module(".".join(rel.with_suffix("").parts))
    monkeypatch.syspath_prepend(str(path.parent))     # as ``python SCRIPT`` puts its folder first
    spec = importlib.util.spec_from_file_location(f"entry_{'_'.join(rel.with_suffix('').parts)}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                      # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_walk_finds_the_entry_points():
    found = {str(p.relative_to(ROOT)) for p in entry_points()}
    for known in ("experiments/train/train_gpt.py", "experiments/checks/memory_check.py", "examples/tour.py",
                  "axgrid/cli.py", "axgrid/perfmodel/__main__.py", "axgrid/launch/flight.py"):
        assert known in found, sorted(found)
    assert len(found) >= 40, sorted(found)


@pytest.mark.parametrize("path", entry_points(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_entry_point_says_a_bad_argument_in_one_line(path, monkeypatch, capsys):
    for name in LAUNCHER_VARS:
        monkeypatch.setenv(name, "")   # then removed: restored at the end even if the test sets it (--debug)
        monkeypatch.delenv(name)
    main_name, prog = _run_call(path)
    main = getattr(_load(path, main_name, monkeypatch), main_name)
    with pytest.raises(SystemExit) as e:
        errors.run(main, prog, BAD)
    out, err = capsys.readouterr()
    assert e.value.code not in (0, None), (e.value.code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith(f"{prog}: "), err
    assert out == "", out


def test_memory_check_with_a_batch_that_does_not_split_is_one_line(tmp_path):
    """--grid 1x1x1x4 --batch 4: each d-rank gets one sequence, which two micro-batches cannot split. Before,
    every rank printed a traceback."""
    cmd = [sys.executable, "-m", "axgrid.cli", "launch", "-n", "4", "--", sys.executable,
           "experiments/checks/memory_check.py", "--device", "cpu", "--grid", "1x1x1x4", "--batch", "4",
           "--layers", "1", "--hidden", "32", "--seq", "8", "--vocab", "64", "--dtype", "fp32"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    assert res.returncode != 0 and len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "memory_check" in lines[0], lines
