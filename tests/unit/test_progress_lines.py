"""Without a terminal (a batch job), a run's progress is a line on stdout every N steps and at the last: step, loss,
tokens/s, seconds per step and the time left; on a terminal the bar shows instead (tests/ranks/test_metrics.py)."""
import io

from axgrid.metrics import MetricsLog
from axgrid.metrics.sinks import ProgressLines


def test_a_line_every_n_steps_and_at_the_last_with_the_time_left():
    out = io.StringIO()
    lines = ProgressLines(total=7, every=3, out=out)
    for s in range(2, 7):                                     # resumed at step 2: steps 3..7 of 7
        lines.step({"event": "step", "step": s, "loss": 2.0 / (s + 1), "tokens_per_s": 1000.0 + s,
                    "step_s": 9.0 if s == 2 else 2.0})        # the first step (warm-up) left out of the mean
    assert out.getvalue().splitlines() == [
        "step 3/7: loss 0.6667, 1002 tokens/s, 9.000 s/step, 0:00:36 left",
        "step 6/7: loss 0.3333, 1005 tokens/s, 2.000 s/step, 0:00:02 left",
        "step 7/7: loss 0.2857, 1006 tokens/s, 2.000 s/step, 0:00:00 left"]


def test_a_metrics_log_without_a_terminal_prints_progress_lines(capsys):
    log = MetricsLog(0, progress=2, progress_every=1)          # pytest's stderr is not a terminal
    for s in range(2):
        log.write({"event": "step", "step": s, "loss": 1.5, "tokens_per_s": 10.0, "step_s": 0.5})
    log.close()
    assert capsys.readouterr().out.splitlines() == ["step 1/2: loss 1.5000, 10 tokens/s, 0.500 s/step, 0:00:00 left",
                                                    "step 2/2: loss 1.5000, 10 tokens/s, 0.500 s/step, 0:00:00 left"]
    MetricsLog(1, progress=2, progress_every=1).write({"event": "step", "step": 1, "loss": 1.0})   # rank 1: nothing
    assert capsys.readouterr().out == ""
