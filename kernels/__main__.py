"""``python -m axgrid.kernels ...`` (see axgrid.kernels.cli)."""
import sys

from .cli import main

sys.exit(main())
