"""experiments/bench/bench_peers_scale.py on a small world: both layouts run their step under the fake process group,
PyTorch's tensor-parallel bytes count inside the node and FSDP2's across nodes, and axgrid's row is its dry run (the
bytes of each grid dimension put inside or across nodes by where its groups lie)."""
from __future__ import annotations

import json

from conftest import PRELOAD
from helpers import ROOT
from helpers.python_process import run_python


def test_both_layouts_count_their_bytes_inside_and_across_nodes(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = run_python([str(ROOT / "experiments/bench/bench_peers_scale.py"), "--model", "gpt-tiny", "--gpus",
                       "16", "--machine", "local-4", "--batch", "16", "--grid", "2x2x1x4", "--json", str(out)],
                      timeout_s=300, preload=tuple(PRELOAD))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["who"] for r in rows] == ["DTensor TP4+SP, FSDP2 over 4", "axgrid 1x1x1x16 (perfmodel's best)",
                                        "axgrid 2x2x1x4"], rows
    torch_row, best, node = rows
    assert torch_row["intra"] > 0 and torch_row["inter"] > 0 and torch_row["peak"] > 0
    assert best["intra"] == 0 and best["inter"] > 0          # 1x1x1x16: only d, across the 4 nodes
    assert node["intra"] > 0 and node["inter"] > 0           # 2x2x1x4: x, y inside a node of 4, d across
