"""The layers a user builds with: ``axgrid.nn.Linear``, the 3D parallel drop-in for ``nn.Linear`` (it lives in the
tensor-parallel room, :mod:`axgrid.tensor_parallel.linear`), and :mod:`axgrid.nn.init`, the hashed initialisation
every parallel layer and model shares (a rank computes its own shard; any grid gives the serial model).

``Linear`` and ``LinearSharding`` load on first use (PEP 562): the tensor-parallel layers import
:mod:`axgrid.nn.init`, so this package must not import them while it loads.
"""
import importlib

from . import init

__all__ = ["Linear", "LinearSharding", "init"]


def __getattr__(name: str):
    if name in ("Linear", "LinearSharding"):
        value = getattr(importlib.import_module("axgrid.tensor_parallel.linear"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'axgrid.nn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
