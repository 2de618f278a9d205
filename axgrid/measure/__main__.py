"""``python -m axgrid.measure``: see :mod:`axgrid.measure.cli`."""
from ..launch.errors import run
from .cli import main

run(main, "axgrid.measure")
