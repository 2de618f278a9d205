"""``python -m axgrid.kernels ...`` (see axgrid.kernels.cli)."""
from axgrid.launch.errors import run

from .cli import main

run(main, "axgrid.kernels")
