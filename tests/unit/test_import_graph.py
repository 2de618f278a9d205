"""What may import what. The grid is topology plus the communicator: it imports no runtime machinery, and the overlap
machinery imports no layer, so there is no cycle grid -> overlap -> nn.linear -> grid. Scripts in experiments/ import
only the library, nothing imports tests/, axgrid.spec imports no torch, and nothing edits sys.path. Checked on the
source (every import statement, also inside functions, where a cycle would hide; ``if TYPE_CHECKING:`` blocks
excepted)."""
import ast
import functools
import os
import re
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "axgrid"


def _module_file(name: str) -> pathlib.Path | None:
    path = ROOT.joinpath(*name.split("."))
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


@functools.lru_cache(maxsize=None)
def _imports(name: str, packages: bool) -> frozenset[str]:
    """The axgrid modules ``name`` imports (resolved, existing), and with ``packages`` the packages they live
    in (whose ``__init__`` runs first). Each file is parsed once per session."""
    f = _module_file(name)
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    todo = list(ast.parse(f.read_text()).body)
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            continue
        todo.extend(ast.iter_child_nodes(node))
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            file = _module_file(t) if t.startswith("axgrid.") else None
            if file is not None and (packages or file.name != "__init__.py"):
                found.add(t)
                parent = t.rpartition(".")[0]
                while packages and parent != "axgrid":          # a submodule runs its packages' __init__ first
                    found.add(parent)
                    parent = parent.rpartition(".")[0]
    return frozenset(found)


def closure(name: str, packages: bool = True) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for m in _imports(todo.pop(), packages) - seen:
            seen.add(m)
            todo.append(m)
    return seen


# --- the rooms: one package per parallelism, each importing the core and never a sibling ---------------------------

#: A package of axgrid named ``*_parallel`` is a room (tensor_parallel, data_parallel; context_parallel and
#: expert_parallel when they come): the rule below holds for every one of them by its name alone.
ROOMS = sorted(f"axgrid.{p.name}" for p in PKG.iterdir()
               if p.name.endswith("_parallel") and (p / "__init__.py").is_file())
ROOM_PREFIXES = tuple(ROOMS)
#: The core: the grid, the communicator, the configuration, the end of the backward, and the runtime that wires the
#: rooms (the one core module allowed to import them).
CORE = tuple(f"axgrid.core.{p.stem}" for p in (PKG / "core").glob("*.py") if p.stem != "__init__")
WIRING = "axgrid.core.runtime"


def _room_of(module: str) -> str | None:
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def _modules(package: str) -> list[str]:
    folder = ROOT.joinpath(*package.split("."))
    return sorted(f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__") + [package]


def test_the_rooms_are_there():
    """Tensor and data parallelism have their rooms; no module of axgrid's top level belongs to one parallelism."""
    assert {"axgrid.tensor_parallel", "axgrid.data_parallel"} <= set(ROOMS), ROOMS
    assert {"axgrid.core.grid", "axgrid.core.comm", "axgrid.core.config", "axgrid.core.backward", WIRING} <= set(CORE)
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")
    assert set(top) <= {"cli", "demo", "optimizer", "train"}, f"axgrid/ has top-level modules {top}: give each a room"


def test_a_room_imports_the_core_and_never_a_sibling():
    """What a room's modules reach (inside functions too, and through any package on the way), except through the
    runtime, holds no module of another room."""
    bad = []
    for room in ROOMS:
        for module in _modules(room):
            seen, todo = set(), [module]
            while todo:
                for m in _imports(todo.pop(), packages=True) - seen:
                    seen.add(m)
                    if m != WIRING:
                        todo.append(m)
            bad += [f"{module} -> {m}" for m in sorted(seen) if _room_of(m) not in (None, room)]
    assert not bad, "a room imports a sibling room:\n" + "\n".join(bad)


def test_the_core_below_the_runtime_imports_no_room():
    """The grid, the communicator, the configuration and the end of the backward import no room: only the runtime
    wires them (and the grid holds a runtime only under TYPE_CHECKING)."""
    bad = [f"{c} -> {m}" for c in CORE if c != WIRING for m in sorted(closure(c)) if _room_of(m)]
    assert not bad, "\n".join(bad)
    assert {_room_of(m) for m in closure(WIRING)} >= {"axgrid.tensor_parallel", "axgrid.data_parallel"}


def test_the_grid_imports_no_runtime_machinery_and_no_layer():
    reach = closure("axgrid.core.grid")
    banned = {m for m in reach if m == "axgrid.core.runtime" or m.startswith(ROOM_PREFIXES)
              or m == "axgrid.nn" or m.startswith("axgrid.nn.")}
    assert not banned, f"axgrid.core.grid reaches {sorted(banned)}"


def test_overlap_imports_no_layer_and_nothing_reaches_back():
    assert not {m for m in closure("axgrid.tensor_parallel.overlap")
                if m.startswith(("axgrid.nn", "axgrid.core.runtime"))}
    for name in ("axgrid.core.grid", "axgrid.tensor_parallel.overlap", "axgrid.core.runtime",
    "axgrid.tensor_parallel.linear",
                 "axgrid.data_parallel.gradients"):
        assert name not in closure(name, packages=False), f"{name} imports itself through a cycle"


def test_the_checker_sees_imports_inside_functions():
    """The check must not pass by missing imports: the runtime's optional tuner import is inside a function."""
    assert {"axgrid.tensor_parallel.overlap", "axgrid.kernels"} <= closure("axgrid.core.runtime")
    assert "axgrid.core.grid" in closure("axgrid.tensor_parallel.linear")


def test_importing_the_grid_loads_no_machinery():
    """The same, as Python sees it: a fresh interpreter that imports axgrid.core.grid has no overlap, runtime or
    layer."""
    code = "import sys, axgrid.core.grid; print(' '.join(m for m in sys.modules if m.startswith('axgrid')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert "axgrid.core.grid" in out
    assert not [m for m in out if m == "axgrid.core.runtime" or m.startswith(ROOM_PREFIXES)
                or m.startswith("axgrid.nn")], out


# --- what may import what across the tree: experiments import only the library; nothing imports tests/ -------------

def _py_files(top: str) -> list[pathlib.Path]:
    return [p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts and "results" not in p.parts]


def _top_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, top-level module name) of every absolute import in ``path`` (inside functions too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def test_experiments_import_only_the_library():
    """A script imports axgrid, the standard library and third-party packages; never another script, tests/, or a
    module beside it -- except the peers' small package, which the benchmarks in experiments/bench/ import."""
    scripts = {p.stem for p in _py_files("experiments")} - {"__init__"}
    tests = {p.stem for p in _py_files("tests")}
    bad = []
    for path in _py_files("experiments"):
        allowed = {"peers"} if path.parent == ROOT / "experiments" / "bench" else set()
        if "peers" in path.parts:                      # the package's own modules import each other relatively
            allowed = set()
        bad += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in _top_imports(path)
                if (name in scripts or name in tests or name in ("experiments", "tests")) and name not in allowed]
    assert not bad, "experiments may import only axgrid (and experiments/bench/peers):\n" + "\n".join(bad)


def test_nothing_imports_from_tests():
    tests = {p.stem for p in _py_files("tests")} | {"tests"}
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for top in ("axgrid", "experiments", "examples")
           for p in _py_files(top) for line, name in _top_imports(p) if name in tests]
    assert not bad, "\n".join(bad)


def test_spec_imports_no_torch():
    """axgrid.spec is what perfmodel and the tuner build on without torch (``if TYPE_CHECKING:`` blocks aside)."""
    bad = []
    for path in _py_files("axgrid/spec"):
        todo = list(ast.parse(path.read_text(encoding="utf-8")).body)
        while todo:
            node = todo.pop()
            if _is_type_checking(node):
                continue
            todo.extend(ast.iter_child_nodes(node))
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                    if n.split(".")[0] in ("torch", "numpy")]
    assert not bad, "\n".join(bad)


def test_no_sys_path_edits_and_no_scripts_loaded_by_path_outside_tests():
    """Scripts and the library find axgrid because it is installed; only the script tests load a script by path."""
    edits = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*\[|sys\.path\s*=")
    by_path = re.compile(r"spec_from_file_location|runpy\.run_path")
    bad = []
    for top in ("axgrid", "experiments", "examples", "tests"):
        for p in _py_files(top):
            text = p.read_text(encoding="utf-8")
            bad += [f"{p.relative_to(ROOT)}: sys.path edit" for _ in edits.finditer(text) if p != pathlib.Path(__file__)]
            if top != "tests":
                bad += [f"{p.relative_to(ROOT)}: loads a file by path" for _ in by_path.finditer(text)]
    assert not bad, "\n".join(bad)


MACHINERY = ("axgrid.core.backward", "axgrid.tensor_parallel.overlap", "axgrid.data_parallel.buckets",
             "axgrid.data_parallel.gradients", "axgrid.core.runtime", "axgrid.tensor_parallel.linear",
             "axgrid.data_parallel.sharded_optimizer")


def _type_checking_imports(name: str) -> set[str]:
    """The axgrid modules ``name`` imports only under ``if TYPE_CHECKING:`` (a dependency the code hides)."""
    f = _module_file(name)
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if not _is_type_checking(node):
            continue
        for imp in ast.walk(node):
            if isinstance(imp, ast.ImportFrom):
                base = imp.module or ""
                if imp.level:
                    parts = package.split(".")[: len(package.split(".")) - imp.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found |= {t for t in [base] + [f"{base}.{a.name}" for a in imp.names] if _module_file(t)}
            elif isinstance(imp, ast.Import):
                found |= {a.name for a in imp.names if _module_file(a.name)}
    return found


def test_the_backward_machinery_calls_down_only():
    """One end of the backward (axgrid.core.backward) at the bottom; the weight source and gradient sink (overlap) and
    the data-parallel buckets (data_parallel.buckets) know neither each other nor the layers: they are handed callables.
    No module of the machinery hides an import of another under TYPE_CHECKING (there were four such arrows)."""
    hidden = {(m, t) for m in MACHINERY for t in _type_checking_imports(m) if t in MACHINERY}
    assert not hidden, sorted(hidden)
    assert not {m for m in closure("axgrid.core.backward", packages=False) if m.startswith("axgrid.")}
    assert not {m for m in closure("axgrid.tensor_parallel.overlap") if m in MACHINERY[2:] or m.startswith("axgrid.nn")}
    assert not {m for m in closure("axgrid.data_parallel.buckets")
                if m in MACHINERY[1:] and m != "axgrid.data_parallel.buckets"}


def test_the_launcher_does_not_reach_the_device_layer():
    """axgrid.device reads the launch (LaunchEnv, LaunchError); launch/ never imports device/ back, not even inside a
    function (launch.env.default_backend did: the caller of init_distributed chooses the backend)."""
    launch = sorted(p.stem for p in (PKG / "launch").glob("*.py"))
    reach = {m: sorted(t for t in closure(f"axgrid.launch.{m}".removesuffix(".__init__"))
                       if t.startswith("axgrid.device")) for m in launch}
    assert not {m: r for m, r in reach.items() if r}, reach
