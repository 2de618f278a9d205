"""``python -m axgrid.dryrun``: see :mod:`axgrid.dryrun.cli`."""
from axgrid.launch.errors import run

from .cli import main

if __name__ == "__main__":
    run(main, "python -m axgrid.dryrun")
