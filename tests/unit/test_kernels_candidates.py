"""Every GEMM candidate computes the same product; margin rule and timing behave."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid.kernels import ROLE_INPUT_LAYOUTS, GemmSignature
from axgrid.kernels.candidates import DEFAULT, Candidate, candidates_for, run
from axgrid.kernels.timing import measure
from axgrid.kernels.tuner import pick_winner, synthetic_operands

torch.set_num_threads(1)


def _operands(sig: GemmSignature):
    return synthetic_operands(sig, torch.device("cpu"))


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 24), n=st.integers(1, 24), k=st.integers(1, 40), role=st.sampled_from(list(ROLE_INPUT_LAYOUTS)))
def test_all_candidates_agree_fp32(m, n, k, role):
    sig = GemmSignature.make(m, n, k, torch.float32, "cpu", role)
    a, b = _operands(sig)
    ref = (a.double() @ b.double()).float()
    names = set()
    for cand in candidates_for(sig, distinct=False):
        out = run(cand, a, b)
        names.add(cand.name)
        assert out.shape == (m, n) and out.is_contiguous() and out.dtype == torch.float32
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert len(names) == 9 and DEFAULT in names
    tuned = {c.name for c in candidates_for(sig)}
    assert len(tuned) == 8 and f"torch:{''.join(ROLE_INPUT_LAYOUTS[role])}:AB" not in tuned


@pytest.mark.parametrize("role", list(ROLE_INPUT_LAYOUTS))
def test_all_candidates_agree_bf16(role):
    sig = GemmSignature.make(33, 17, 48, "bf16", "cpu", role)
    a, b = _operands(sig)
    ref = a.double() @ b.double()
    for cand in candidates_for(sig, distinct=False):
        out = run(cand, a, b)
        assert out.dtype == torch.bfloat16 and out.is_contiguous()
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=5e-2 * 48 ** 0.5)


def test_candidate_names_round_trip_and_bad_name():
    for cand in candidates_for(GemmSignature.make(2, 2, 2, "fp32", "cpu", "forward")):
        assert Candidate.parse(cand.name) == cand
    with pytest.raises(ValueError, match="bad GEMM candidate name 'torch:XY:AB'"):
        Candidate.parse("torch:XY:AB")


def test_no_cupy_candidates_for_bf16_or_cpu():
    for dt in ("bf16", "fp32"):
        assert all(c.backend != "cupy" for c in candidates_for(GemmSignature.make(4, 4, 4, dt, "cpu", "forward")))
    assert all(c.backend != "cupy" for c in candidates_for(GemmSignature.make(4, 4, 4, "bf16", "cuda", "forward")))


def test_margin_rule():
    assert pick_winner({DEFAULT: 1.0, "torch:NT:AB": 0.98}, 0.03) == DEFAULT
    assert pick_winner({DEFAULT: 1.0, "torch:NT:AB": 0.90, "torch:TT:AB": 0.95}, 0.03) == "torch:NT:AB"
    assert pick_winner({DEFAULT: 1.0, "torch:NT:AB": 0.90}, 0.2) == DEFAULT
    assert pick_winner({DEFAULT: 1.0}, 0.03) == DEFAULT


def test_measure_respects_time_cap():
    import time
    calls = {"x": 0}

    def slow():
        calls["x"] += 1
        time.sleep(0.01)

    # 10 ms calls, 200 ms in all: about 10 warm-up calls and 5 timed rounds (a loaded host makes fewer, never more)
    meas = measure({"a": slow, "b": slow}, "cpu", warmup=50, repeats=1000, max_seconds=0.2)
    assert 1 <= meas.rounds < 12 and set(meas.median_s) == {"a", "b"}
    assert calls["x"] < 40


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        GemmSignature.make(1, 1, 1, "fp8", "cpu", "forward")
    with pytest.raises(ValueError, match="unknown GEMM role 'backward'"):
        GemmSignature.make(1, 1, 1, "fp32", "cpu", "backward")
    with pytest.raises(ValueError, match="n=0"):
        GemmSignature.make(1, 0, 1, "fp32", "cpu", "forward")
