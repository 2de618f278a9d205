"""``python -m kernels ...`` (see kernels.cli)."""
import sys

from .cli import main

sys.exit(main())
