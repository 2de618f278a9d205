"""Models built from axgrid layers."""
from .mlp import MLPStack

__all__ = ["MLPStack"]
