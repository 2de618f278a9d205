"""What installing and importing axgrid brings: a lazy top-level package, and only the import name `axgrid`."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_import_axgrid_and_layout_loads_no_torch():
    _run("import sys, axgrid, axgrid.spec.layout; from axgrid import GridShape, GridError, RankLayout; "
         "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'axgrid.grid'))); "
         "assert not bad, bad; assert axgrid.__version__")


def test_every_public_name_loads_on_first_use():
    _run("import types, axgrid, axgrid.plans, axgrid.plans.parallelize, axgrid.generation.loop\n"
         "for name in axgrid.__all__: assert getattr(axgrid, name) is not None, name\n"
         "assert set(axgrid.__all__) <= set(dir(axgrid))\n"
         # no public function shares its name with a top-level module that would be bound over it on import
         "assert callable(axgrid.parallelize) and callable(axgrid.generate)\n"
         "assert axgrid.parallelize is axgrid.plans.parallelize.parallelize\n"
         "from axgrid import init, nn, Grid; assert nn.Linear is axgrid.nn.Linear and Grid is axgrid.Grid\n"
         "assert axgrid.models.gpt.GPT is axgrid.models.GPT\n"
         "assert not hasattr(axgrid, 'no_such_name')")


def test_no_public_function_shares_its_name_with_a_top_level_module():
    """Importing a submodule binds it on its package: a function ``axgrid.X`` beside a module ``axgrid/X.py`` (or a
    package ``axgrid/X/``) would be replaced by the module once anything imports it."""
    import axgrid
    clashes = [n for n in axgrid.__all__ if n not in ("nn", "plans")
               and ((ROOT / "axgrid" / f"{n}.py").exists() or (ROOT / "axgrid" / n / "__init__.py").exists())]
    assert not clashes, clashes


# --- one import name: the code in kernels/ and perfmodel/ is imported only as axgrid.kernels / axgrid.perfmodel ---

SOURCE_DIRS = ("axgrid", "kernels", "perfmodel", "experiments", "tests")
TOP_LEVEL = ("kernels", "perfmodel")
#: `python -m kernels`, `"-m", "perfmodel"`, import_module("kernels.x"): the old names in commands and strings
OLD_NAME_IN_TEXT = re.compile(r"""-m["',\s]+(kernels|perfmodel)\b|import_module\(\s*["'](kernels|perfmodel)\b"""
                              r"""|^\s*(import|from)\s+(kernels|perfmodel)\b""", re.MULTILINE)


def _tree_files(suffixes: tuple[str, ...]) -> list[Path]:
    """The repository's files under SOURCE_DIRS with these suffixes, symlinked folders not followed."""
    found = []
    for top in SOURCE_DIRS:
        for folder, dirs, names in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "results")]
            found += [Path(folder) / n for n in names if n.endswith(suffixes)]
    return found


def test_no_module_imports_the_top_level_names():
    bad = []
    for path in _tree_files((".py",)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in TOP_LEVEL]
    assert not bad, "import these as axgrid.kernels / axgrid.perfmodel:\n" + "\n".join(bad)


def test_no_command_or_doc_names_the_top_level_packages():
    files = _tree_files((".py", ".sh", ".sbatch", ".md")) + [ROOT / "README.md", ROOT / "Makefile"]
    bad = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}" for p in files if p != Path(__file__).resolve()
           for m in OLD_NAME_IN_TEXT.finditer(p.read_text(encoding="utf-8"))]
    assert not bad, "use python -m axgrid.kernels / axgrid.perfmodel:\n" + "\n".join(bad)


def test_symlinks_make_the_top_level_folders_subpackages():
    for name in TOP_LEVEL:
        link = ROOT / "axgrid" / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}", f"axgrid/{name} must link to ../{name}"


def test_wheel_installs_only_the_axgrid_import_name(tmp_path):
    """The built wheel holds axgrid/ with kernels/ and perfmodel/ (and the machine TOMLs) inside it, nothing else."""
    src = tmp_path / "src"
    for name in ("axgrid", *TOP_LEVEL):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("axgrid-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert zf.read(top_level).decode().split() == ["axgrid"]
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"axgrid"}
    for name in TOP_LEVEL:
        expected = {f"axgrid/{name}/{p.name}" for p in (ROOT / name).glob("*.py")}
        assert expected and expected <= names, sorted(expected - names)
    machines = {f"axgrid/perfmodel/machines/{p.name}" for p in (ROOT / "perfmodel" / "machines").glob("*")
                if p.name.endswith((".toml", ".residuals.json"))}                  # machines and their error bands
    assert machines and machines <= names, sorted(machines - names)
    assert "axgrid/data/text/kjv_selections.txt" in names                            # the drivers' default text
    assert "axgrid/data/instructions/kjv_instructions.jsonl" in names                # finetune's instruction set
