"""``python -m axgrid.perfmodel``: errors said as one line (axgrid.launch.errors, torch-free like the model)."""
from axgrid.launch.errors import run

from .cli import main

run(main, "perfmodel")
