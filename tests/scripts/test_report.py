"""experiments/plots/report.py on the logs of a real 2-rank train_gpt run: the table (Markdown, CSV) holds the run's
figures as axgrid.metrics summarises them, the step time splits into compute and exposed communication per
dimension, and the PNG plots are written; a file that is not a metrics log is refused, naming it."""
import csv
import json

import pytest

from helpers import load_script

ARGS = ["--model", "gpt-tiny", "--hidden", "32", "--heads", "2", "--seq", "16", "--batch", "4", "--steps", "3",
        "--data", "text", "--no-progress", "--comm-timing"]


SCRIPTS = {"train_gpt": "train/train_gpt.py", "report": "plots/report.py", "plot_loss": "plots/plot_loss.py"}


def _script(name: str):
    return load_script(SCRIPTS[name])


def rank_train(argv: list) -> dict:
    return _script("train_gpt").main(argv)


def test_report_on_a_real_two_rank_run(ranks, tmp_path):
    logs = [str(tmp_path / f"{g}.jsonl") for g in ("1x2x1x1", "1x1x1x2")]
    for g, log in zip(("1x2x1x1", "1x1x1x2"), logs):
        ranks(2, rank_train, ARGS + ["--grid", g, "--log", log])
    out = tmp_path / "report"
    rows = _script("report").main([*logs, "--out", str(out)])
    summaries = [[json.loads(line) for line in open(log)][-1] for log in logs]
    for row, summary, grid in zip(rows, summaries, ("1x2x1x1", "1x1x1x2")):
        assert row["grid"] == grid and row["model"] == "gpt-tiny" and row["batch"] == 4 and row["world"] == 2
        assert row["tokens_per_s"] == pytest.approx(summary["tokens_per_s"])
        assert row["tflops"] == pytest.approx(summary["tflops"])
        assert row["peak_mem_gib"] == pytest.approx(summary["peak_mem_bytes"] / 2**30)
        assert row["mfu"] is None and row["j_per_token"] is None                  # no peak, no energy here
        exposed = [row[f"exposed_{d}_s"] for d in ("x", "y", "z", "d", "other")]
        assert row["compute_s"] + sum(exposed) == pytest.approx(row["step_s"])
        assert row["compute_s"] > 0
    assert rows[0]["exposed_y_s"] > 0 and rows[0]["exposed_d_s"] == 0            # 1x2x1x1 talks over y only
    assert rows[1]["exposed_d_s"] > 0 and rows[1]["exposed_y_s"] == 0
    with open(out / "report.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["grid"] for r in table] == ["1x2x1x1", "1x1x1x2"]
    assert float(table[0]["tokens_per_s"]) == pytest.approx(rows[0]["tokens_per_s"])
    md = (out / "report.md").read_text()
    assert [line.split(" | ")[3] for line in md.splitlines() if line.startswith("| 1x")] == ["1x2x1x1", "1x1x1x2"]
    assert "Energy: none:" in md
    for png in ("throughput.png", "step_split.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 100_000


def test_report_refuses_what_is_not_a_metrics_log(tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"event": "config"}\n')
    with pytest.raises(SystemExit, match="notes.jsonl: no config row or no step rows"):
        _script("report").main([str(bad), "--out", str(tmp_path / "r")])
    bad.write_text("not json\n")
    with pytest.raises(SystemExit, match="notes.jsonl:1: not a JSON line"):
        _script("report").main([str(bad), "--out", str(tmp_path / "r")])


def rank_refusal(argv: list) -> str:
    try:
        _script("train_gpt").main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


def test_bad_metrics_options_end_every_rank_alike(ranks):
    base = ARGS + ["--grid", "1x1x1x2"]
    peak = ranks(2, rank_refusal, base + ["--peak-tflops", "0"])
    assert peak[0] == peak[1] and "--peak-tflops 0.0: the device's dense peak must be > 0" in peak[0]
    machine = ranks(2, rank_refusal, base + ["--peak-machine", "no-such-machine"])
    assert machine[0] == machine[1] and machine[0].startswith("--peak-machine no-such-machine: unknown machine")


def test_plot_loss_draws_a_log_and_refuses_a_file_without_steps(tmp_path):
    log = tmp_path / "run.jsonl"
    rows = [{"event": "config"}] + [{"event": "step", "step": i, "loss": 3.0 - 0.1 * i} for i in range(6)]
    rows += [{"event": "eval", "step": 0, "valid_loss": 3.1}, {"event": "eval", "step": 6, "valid_loss": 2.5}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _script("plot_loss").main([str(log), str(tmp_path / "loss.png"), "--window", "3"])
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"event": "config"}) + "\n")
    with pytest.raises(SystemExit, match="holds no step rows"):
        _script("plot_loss").main([str(empty), str(tmp_path / "x.png")])
