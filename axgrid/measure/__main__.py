"""``python -m axgrid.measure``: see :mod:`axgrid.measure.cli`."""
from .cli import main

main()
