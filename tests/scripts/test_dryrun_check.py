"""experiments/checks/dryrun_check.py under the launcher: 4 gloo ranks of a small Hugging Face Llama (grouped-query
attention) on 1x2x2x1 measure their step, rank 0 dry-runs ranks 0 and 3 of the same configuration, and each line
says the ledgers are equal and the peaks within 5% (exit 0), and the dry run agrees with perfmodel."""
import json
import os
import subprocess
import sys

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "experiments", "checks", "dryrun_check.py")


def test_the_dry_run_equals_launched_ranks(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 64,
        "tie_word_embeddings": False}))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    launch = [sys.executable, "-m", "axgrid.cli", "launch", "-n", "4", "--"]
    p = subprocess.run(launch + [sys.executable, SCRIPT, "--model", str(tmp_path), "--grid", "1x2x2x1", "--batch", "4",
                                 "--seq", "16", "--microbatches", "2"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [x for x in p.stdout.splitlines() if "dryrun_check:" in x]
    assert len(lines) == 3 and all("ledger equal" in x for x in lines[:2]), p.stdout[-3000:]
    assert lines[2].endswith("the dry run against perfmodel (what it models): agree"), p.stdout[-3000:]
