"""axgrid.launch.errors: the project's own errors are one line, said once per job (rank 0, or the launcher from the
rank's record), a bug keeps its traceback, ``--debug`` / ``AXGRID_DEBUG=1`` shows every traceback; the launcher
refuses a bad ``--grid`` or a missing script before starting a rank; a grid run alone says how to launch it.
(The same under real launchers: tests/system/test_first_hour.py.)"""
import sys

import pytest

from axgrid.launch import errors
from axgrid.launch.env import LAUNCH_DIR_VAR, LaunchEnv, grid_shape_for
from axgrid.launch.local import preflight
from axgrid.spec import GridError
from axgrid.train import train_step

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                 "SLURM_NTASKS", LAUNCH_DIR_VAR, errors.DEBUG_VAR)


@pytest.fixture
def alone(monkeypatch):
    """A process with no launcher variables (world size 1)."""
    for name in LAUNCHER_VARS:
        monkeypatch.setenv(name, "")   # then removed: restored at the end even if the test sets it (--debug)
        monkeypatch.delenv(name)
    return monkeypatch


def _raised(fn):
    try:
        fn()
    except BaseException as e:        # noqa: B036 - the exception is what the test inspects
        return e
    raise AssertionError("no exception")


def test_what_counts_as_the_projects_own_error():
    assert errors.is_user_error(SystemExit("--batch 3 is not divisible by ..."))
    assert not errors.is_user_error(SystemExit(0)) and not errors.is_user_error(SystemExit(2))
    assert errors.is_user_error(GridError("grid 2x2 must name 3 or 4 sizes"))      # a class axgrid defines
    ours = _raised(lambda: train_step(None, None, None, None, microbatches=0))     # a `raise` in axgrid's code
    assert isinstance(ours, ValueError) and errors.is_user_error(ours)
    assert not errors.is_user_error(_raised(lambda: int("x")))                     # a builtin: a bug
    assert not errors.is_user_error(_raised(lambda: {}["k"]))
    assert not errors.is_user_error(KeyboardInterrupt())


def test_one_line_names_the_program_once():
    assert errors.one_line(SystemExit("--steps 0: must be >= 1"), "train_gpt") == "train_gpt: --steps 0: must be >= 1"
    assert errors.one_line(SystemExit("train_gpt: bad grid"), "train_gpt") == "train_gpt: bad grid"
    assert errors.one_line(ValueError("two\nlines"), "report") == "report: two lines"


def test_debug_flag_is_taken_before_a_separator_only():
    assert errors.split_debug(["--debug", "-n", "2", "--", "python", "x.py", "--debug"]) == \
        (["-n", "2", "--", "python", "x.py", "--debug"], True)
    assert errors.split_debug(["--steps", "3"]) == (["--steps", "3"], False)


def _fail_with_grid_error(argv):
    raise GridError(f"grid {argv[0]!r} is not of the form GXxGYxGZxGD")


def test_run_says_one_line_alone_and_a_traceback_with_debug(alone, capsys):
    with pytest.raises(SystemExit) as e:
        errors.run(_fail_with_grid_error, "train_gpt", ["2x2xlx1"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err == "train_gpt: grid '2x2xlx1' is not of the form GXxGYxGZxGD\n"
    with pytest.raises(SystemExit) as e:
        errors.run(_fail_with_grid_error, "train_gpt", ["2x2xlx1", "--debug"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "Traceback (most recent call last)" in err and "_fail_with_grid_error" in err
    with pytest.raises(ZeroDivisionError):                                      # a bug: raised on, traceback
        errors.run(lambda argv: 1 / 0, "train_gpt", [])


def test_a_usage_error_is_one_line_with_argparse_code(alone, capsys):
    import argparse
    p = errors.usage_errors_raise(argparse.ArgumentParser(prog="report.py"))
    p.add_argument("--out", required=True)
    with pytest.raises(SystemExit) as e:
        errors.run(p.parse_args, "report", [])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("report: error: the following arguments are required: --out "
                                       "(see report.py --help)\n")


def test_once_per_job_rank_0_says_it_others_stay_quiet(alone, capsys):
    alone.setattr(errors, "QUIET_RANK_DELAY_S", 0.0)
    for rank, said in ((0, "finetune: no config.json\n"), (3, "")):
        alone.setenv("RANK", str(rank))
        alone.setenv("WORLD_SIZE", "4")
        assert errors.say(SystemExit("no config.json"), "finetune") == 1
        assert capsys.readouterr().err == said


def test_under_axgrid_launch_the_rank_records_its_line_for_the_launcher(alone, capsys, tmp_path):
    alone.setenv("RANK", "2")
    alone.setenv("WORLD_SIZE", "4")
    alone.setenv(LAUNCH_DIR_VAR, str(tmp_path))
    errors.say(GridError("grid 2x2x2x1 has 8 ranks but the world size is 4"), "train_gpt")
    assert capsys.readouterr().err == ""
    assert errors.recorded(str(tmp_path), 2) == "train_gpt: grid 2x2x2x1 has 8 ranks but the world size is 4"
    assert errors.recorded(str(tmp_path), 0) is None


@pytest.mark.parametrize("cmd,msg", [
    (["python", "train.py", "--grid", "2x2x2x1"], "train.py: no such script"),
    (["python", "-m", "axgrid.demo", "--grid", "2x2xlx1"], "--grid 2x2xlx1: grid '2x2xlx1' is not of the form"),
    (["python", "-m", "axgrid.demo", "--grid=2x2x2x1"], "--grid 2x2x2x1 needs 8 ranks but -n is 4: use -n 8"),
    (["python", "-m", "axgrid.demo", "--grid", "3x1x1"], "Gx*Gy*Gz=3 does not divide the world size 4"),
])
def test_the_launcher_refuses_before_starting_a_rank(cmd, msg):
    with pytest.raises((GridError, ValueError, RuntimeError), match=msg.replace("*", r"\*")):
        preflight(4, cmd)


def test_the_launcher_leaves_grids_of_other_jobs_alone():
    preflight(4, ["python", "-m", "axgrid.demo", "--grid", "2x1x1"])                  # Gd inferred: 2x1x1x2
    preflight(4, ["python", "-m", "axgrid.perfmodel", "rank", "--grid", "4x4x4x4"])    # priced, not run here


def test_a_grid_run_alone_says_how_to_launch_it(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python3", "examples/tour.py"])
    alone_env = LaunchEnv(0, 1, 0, 1, "127.0.0.1", 0, "single")
    with pytest.raises(GridError, match=r"grid 2x2x2x1 needs 8 ranks, but this process runs alone \(no launcher, "
                                        r"world size 1\): start it with `axgrid launch -n 8 -- python "
                                        r"examples/tour.py`"):
        grid_shape_for("2x2x2x1", alone_env)
    with pytest.raises(GridError, match="axgrid launch -n 4 --"):
        grid_shape_for("2x2x1", alone_env)
    with pytest.raises(GridError) as e:                              # under a launcher: no hint
        grid_shape_for("2x2x2x1", LaunchEnv(0, 4, 0, 4, "127.0.0.1", 1, "torchrun"))
    assert "axgrid launch" not in str(e.value)
