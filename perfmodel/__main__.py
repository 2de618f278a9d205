"""``python -m axgrid.perfmodel``."""
import sys

from .cli import main

sys.exit(main())
