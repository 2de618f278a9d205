"""examples/fabric_train.py started as a user starts it, by Lightning Fabric's own launcher: ``python
examples/fabric_train.py`` re-runs itself in a second process (Fabric's subprocess launcher, LightningEnvironment,
gloo), and trains to the losses of serial training."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers.fabric_serial import serial_fabric_losses

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARGV = ["--grid", "1x1x1x2", "--zero", "1", "--steps", "2", "--batch", "4", "--seq", "16"]


def test_fabric_launcher_starts_the_ranks_and_trains_as_serially(tmp_path):
    pytest.importorskip("lightning_fabric")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "fabric_train.py"), *ARGV], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    printed = [float(x) for x in re.findall(r"^step \d+: loss ([0-9.]+)$", run.stdout, re.M)]
    want = serial_fabric_losses(steps=2, batch=4, seq=16)
    assert printed == pytest.approx(want, rel=1e-4), (printed, want)
