"""The step's small-model terms (issue 37): a GEMM's wave occupancy on the GPU's SMs, the host's time of
kernel_latency per kernel and how it combines with the GPU's, the optimizer step and the cross entropy through HBM -- each by hand."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid import perfmodel as pm
from axgrid.perfmodel import pipeline as pl
from axgrid.perfmodel.compute import (BLOCK_KERNELS_UNFUSED, OPTIMIZER_BYTES, OUTER_KERNELS, gemm_rate,
                                      tile_efficiency, wave_efficiency)
from axgrid.perfmodel.machines import machine_to_toml
from axgrid.perfmodel.model import host_bound
from axgrid.spec import TransformerShape


def test_wave_occupancy_on_108_sms_by_hand():
    m = pm.load_machine("dgx-a100")
    assert m.sm_count == 108 and (256, 128) in m.gemm_tiles and (64, 64) in m.gemm_tiles
    # a tile's roofline from L2: 2·r·c / ((r + c)·2 bytes) FLOPs per byte against peak / L2 bandwidth (43.2 here)
    need = m.peak_flops_bf16 / m.l2_bandwidth
    assert tile_efficiency((256, 128), m, "fp16") == 1.0 and tile_efficiency((128, 128), m, "fp16") == 1.0
    assert tile_efficiency((64, 64), m, "fp16") == pytest.approx(32 / need)
    assert tile_efficiency((128, 64), m, "fp16") == pytest.approx((128 * 64 / 192) / need)
    # [1024, 384]: 64×64 tiles, 16 × 6 = 96 of them in one wave of 108 (a 128×128 tile: 24 tiles, 24/108)
    e64 = 1024 * 384 / (108 * 64 * 64) * 32 / need
    assert wave_efficiency(1024, 384, m) == pytest.approx(e64) and e64 > 24 / 108
    # [128·109, 128]: 128×64 tiles, 218 in three waves (128×128: 109 tiles, two waves, 109/216 busy)
    assert wave_efficiency(128 * 109, 128, m) == pytest.approx(
        128 * 109 * 128 / (3 * 108 * 128 * 64) * (128 * 64 / 192) / need)
    assert wave_efficiency(128 * 108, 128 * 2, m) == pytest.approx(1.0)              # 108 tiles of 256×128
    # 16 batched [1024, 1024]: 128×64 tiles, 2,048 in 19 waves beat 128×128's 1,024 in 10
    assert wave_efficiency(1024, 1024, m, batch=16) == pytest.approx(
        16 * 1024 * 1024 / (19 * 108 * 128 * 64) * (128 * 64 / 192) / need)
    assert float(gemm_rate(1024, 384, 1024, m, "fp16")) == pytest.approx(
        m.peak_flops_bf16 * 0.869 * 384 / (384 + 96.0) * e64)
    assert wave_efficiency(1024, 384, pm.load_machine("perlmutter")) == 1.0       # no sm_count: not modelled
    one = replace(m, gemm_tiles=((128, 128),), l2_bandwidth=0.0)                  # one tile: its wave occupancy
    assert wave_efficiency(1024, 384, one) == pytest.approx(24 / 108)
    assert wave_efficiency(128 * 109, 128, one) == pytest.approx(109 / 216)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 64))
def test_more_tiles_never_slower(mm, nn, batch):
    m = pm.load_machine("dgx-a100")
    one = replace(m, gemm_tiles=((128, 128),))
    assert wave_efficiency(mm, nn, m, batch) >= wave_efficiency(mm, nn, one, batch) * (1 - 1e-12)
    assert 0.0 < wave_efficiency(mm, nn, m, batch) <= 1.0


def test_a_small_stage_is_held_to_the_hosts_kernel_rate():
    m = pm.load_machine("dgx-a100")
    spec = TransformerShape("small", 12, 512, 8, seq=1024, vocab=51200)
    prob = pm.Problem(spec, 16, 8, "fp16", pm.Options(dropout=True, fused_attention=False, grad_reduce="fp16"))
    row = pl.price(prob, m, [pl.TPPPDP(8, 1, 1, mbs=1, recompute="full")])[0]
    kernels = spec.layers * BLOCK_KERNELS_UNFUSED * 4 + 3 * OUTER_KERNELS            # forward, recompute, backward×2
    optimizer = spec.params / 8 * OPTIMIZER_BYTES["megatron"] / m.hbm_bandwidth
    plain = replace(m, host_device_exponent=0.0)       # the plain maximum: the host's floor alone here
    row = pl.price(prob, plain, [pl.TPPPDP(8, 1, 1, mbs=1, recompute="full")])[0]
    assert row.compute_s == pytest.approx(16 * kernels * m.kernel_latency + optimizer)
    fast = pl.price(prob, replace(m, kernel_latency=0.0), [pl.TPPPDP(8, 1, 1, mbs=1, recompute="full")])[0]
    assert fast.compute_s < row.compute_s / 2          # the GPU's own work is far below the host's floor here
    # the shipped smooth maximum: (gpu³ + host³)^(1/3) per micro-batch, the GPU's time from the run without a floor
    smooth = pl.price(prob, m, [pl.TPPPDP(8, 1, 1, mbs=1, recompute="full")])[0]
    gpu, host = (fast.compute_s - optimizer) / 16, kernels * m.kernel_latency
    assert m.host_device_exponent == 3.0
    assert smooth.compute_s == pytest.approx(16 * (gpu**3 + host**3) ** (1 / 3) + optimizer)


def test_host_bound_by_hand():
    m = pm.load_machine("dgx-a100")
    d, h = np.array([1.0, 3.0, 0.0]), np.array([2.0, 1.0, 0.0])
    assert host_bound(d, h, replace(m, host_device_exponent=0.0)).tolist() == [2.0, 3.0, 0.0]
    assert host_bound(d, h, replace(m, host_device_exponent=1.0)).tolist() == pytest.approx([3.0, 4.0, 0.0])
    assert host_bound(d, h, m) == pytest.approx([9 ** (1 / 3), 28 ** (1 / 3), 0.0])


def test_optimizer_step_is_sharded_over_d_with_a_distributed_optimizer():
    m = pm.load_machine("dgx-a100")
    prob = pm.Problem(pm.get_model("gpt-5b"), 64, 32)
    g = pm.Grids.of([(1, 8, 1, 4)])
    zero0 = pm.evaluate(prob, m, g).extra["optimizer"][0]
    zero1 = pm.evaluate(replace(prob, options=prob.options.with_(zero=1)), m, g).extra["optimizer"][0]
    assert zero0 == pytest.approx(prob.model.params / 8 * OPTIMIZER_BYTES["axgrid"] / m.hbm_bandwidth)
    assert zero1 == pytest.approx(zero0 / 4)


def test_new_machine_fields_roundtrip_and_are_checked(tmp_path):
    m = pm.load_machine("dgx-a100")
    f = tmp_path / "a.toml"
    f.write_text(machine_to_toml(m))
    back = pm.load_machine(f)
    assert (back.sm_count, back.gemm_tiles, back.l2_bandwidth, back.kernel_latency, back.host_device_exponent) == (
        108, m.gemm_tiles, m.l2_bandwidth, m.kernel_latency, m.host_device_exponent)
    assert back.collective_tables == m.collective_tables and back.hbm_bandwidth == m.hbm_bandwidth
    f.write_text(machine_to_toml(m).replace("gemm_tiles = [[256, 128]", "gemm_tiles = [[256]"))
    with pytest.raises(pm.MachineFileError, match=r"gemm_tiles' must be a list of \[rows, columns\]"):
        pm.load_machine(f)
    assert np.isfinite(m.kernel_latency) and 0 < m.kernel_latency < 1e-3
