"""experiments/checks/dryrun_check.py as ``axgrid launch -n 4 --`` runs it: 4 gloo ranks (the session's rank pool,
the script's ``__main__`` on each: no interpreter started per rank; the launcher itself is tests/system's) of a small
Hugging Face Llama (grouped-query attention) on 1x2x2x1 measure their step, rank 0 dry-runs ranks 0 and 3 of the same
configuration, and each line says the ledgers are equal and the peaks within 5% (exit 0), and the dry run agrees with
perfmodel."""
import json
import os

from helpers import ROOT
from helpers.python_process import run_entry_point

SCRIPT = os.path.join("experiments", "checks", "dryrun_check.py")


def test_the_dry_run_equals_launched_ranks(ranks, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 64,
        "tie_word_embeddings": False}))
    words = ["python", SCRIPT, "--model", str(tmp_path), "--grid", "1x2x2x1", "--batch", "4", "--seq", "16",
             "--microbatches", "2"]
    results = ranks(4, run_entry_point, words, str(ROOT))
    out = results[0][1]
    assert [code for code, _ in results] == [0] * 4, out[-3000:]
    lines = [x for x in out.splitlines() if "dryrun_check:" in x]
    assert len(lines) == 3 and all("ledger equal" in x for x in lines[:2]), out[-3000:]
    assert lines[2].endswith("the dry run against perfmodel (what it models): agree"), out[-3000:]
