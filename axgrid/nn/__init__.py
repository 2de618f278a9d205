"""Parallel layers on the grid."""
from . import init
from .linear import Linear, LinearSharding

__all__ = ["Linear", "LinearSharding", "init"]
