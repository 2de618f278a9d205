"""Hand-computed cases for perfmodel's formulas (no torch needed)."""
import numpy as np
import pytest

from axgrid import perfmodel as pm
from axgrid.perfmodel.comm import FCLayer, dim_strides, ring_alpha_beta, ring_time
from axgrid.perfmodel.memory import memory_per_gpu
from axgrid.perfmodel.space import enumerate_grids
from axgrid.spec import TransformerShape


def test_ring_costs_by_hand():
    # all-reduce p=4, S=1000 B, α=1 µs, β=1000 B/s: 2·3/4·1 s + 2·3·1 µs
    assert ring_time("all_reduce", 4, 1000, 1e-6, 1e3) == pytest.approx(1.5 + 6e-6)
    assert ring_time("all_gather", 4, 1000, 1e-6, 1e3) == pytest.approx(0.75 + 3e-6)
    assert ring_time("reduce_scatter", 2, 1000, 1e-6, 1e3) == pytest.approx(0.5 + 1e-6)
    assert ring_time("all_reduce", 1, 1000, 1e-6, 1e3) == 0.0
    with pytest.raises(pm.PerfModelError):
        ring_time("broadcast", 2, 1, 1, 1)


def test_normal_layer_volumes_2x3x2x1():
    # W [n=6, k=4] normal, bias; grid 2x3x2x1; 8 tokens per micro-batch → m' = 8/(Gd·Gz) = 4.
    # block = (6/3)·(4/2) = 4 (divisible by Gz=2). bf16 = 2 bytes.
    layers = [FCLayer(6, 4, False, True)]
    b = pm.collective_bytes(layers, (2, 3, 2, 1), 8, 1, 2)
    assert b == {("z", "all_gather"): 2 * 4 * 2,       # forward + backward AG_z(4)
                 ("x", "all_reduce"): 4 * 2 * 2,       # AR_x(m'·n/Gy = 8)
                 ("y", "all_reduce"): 4 * 2 * 2,       # AR_y(m'·k/Gx = 8)
                 ("z", "reduce_scatter"): 4 * 2,       # RS_z(4)
                 ("z", "all_reduce"): 2 * 2}           # bias AR_z(n/Gy = 2); Gd = 1: no AR_d
    c = pm.collective_calls(layers, (2, 3, 2, 1), 8, 1, 2)
    assert c == {("z", "all_gather"): 2, ("x", "all_reduce"): 1, ("y", "all_reduce"): 1,
                 ("z", "reduce_scatter"): 1, ("z", "all_reduce"): 1}


def test_transposed_layer_swaps_x_and_y():
    # W [n=4, k=6] transposed on 2x3x2x1: block (4/Gx=2)·(6/Gy=2) = 4; fwd AR_y(m'·n/Gx = 8), bwd AR_x(m'·k/Gy = 8).
    layers = [FCLayer(4, 6, True, True)]
    b = pm.collective_bytes(layers, (2, 3, 2, 1), 8, 1, 1)
    assert b == {("z", "all_gather"): 8, ("y", "all_reduce"): 8, ("x", "all_reduce"): 8,
                 ("z", "reduce_scatter"): 4, ("z", "all_reduce"): 2}   # bias AR_z(n/Gx = 2)


def test_padding_to_multiple_of_gz_and_data_parallel():
    # W [3, 2] normal on 2x3x2x2: block (3/3)·(2/2) = 1 → padded to 2 for Gz=2; shard = 1.
    # 16 tokens per micro-batch → m' = 16/(2·2) = 4; 3 micro-batches; 4-byte elements.
    layers = [FCLayer(3, 2, False, True)]
    b = pm.collective_bytes(layers, (2, 3, 2, 2), 16, 3, 4)
    assert b[("z", "all_gather")] == 3 * 2 * 2 * 4
    assert b[("z", "reduce_scatter")] == 3 * 2 * 4
    assert b[("x", "all_reduce")] == 3 * 4 * 1 * 4      # AR_x(m'·n/Gy = 4)
    assert b[("y", "all_reduce")] == 3 * 4 * 1 * 4      # AR_y(m'·k/Gx = 4)
    assert b[("z", "all_reduce")] == 3 * 1 * 4          # bias n/Gy = 1
    # weight shard 1 + bias 1, once per step; then an int32 "used" flag per parameter (2)
    assert b[("d", "all_reduce")] == (1 + 1) * 4 + 2 * 4
    # One call, not two: the runtime packs the weight shard's and the bias's gradients into one 25 MiB bucket
    # and posts one all-reduce per bucket (perfmodel used to count one call per tensor); one more: the flags.
    assert pm.collective_calls(layers, (2, 3, 2, 2), 16, 3, 4)[("d", "all_reduce")] == 1 + 1
    # with 4-byte buckets each tensor fills one: two calls of 4 B (and the flags)
    assert pm.collective_calls(layers, (2, 3, 2, 2), 16, 3, 4, bucket_bytes=4)[("d", "all_reduce")] == 2 + 1


def test_dp_buckets_pack_like_the_runtime():
    from axgrid.perfmodel.comm import dp_buckets
    # axgrid.spec.buckets: join the open bucket; close it once it holds the limit or more
    assert dp_buckets([4, 4, 4], 8) == [8, 4]
    assert dp_buckets([4, 20, 4], 8) == [24, 4]
    assert dp_buckets([3, 0, 5, 1], 8) == [8, 1]             # 0-byte tensors (no bias) do not exist
    assert dp_buckets([3, 6, 1], 8) == [9, 1]
    # zero >= 1: each bucket padded to a multiple of Gd elements (here 4-byte elements, Gd = 3)
    assert dp_buckets([8, 8, 8], 16, parts=3, element_bytes=4) == [24, 12]    # 4 elements -> 6, 2 -> 3
    assert dp_buckets([12], 64, parts=3, element_bytes=4) == [12]
    assert dp_buckets([], 8) == []
    with pytest.raises(pm.PerfModelError):
        dp_buckets([1], 0)


def test_dp_term_priced_per_bucket_by_hand():
    # One layer W [8, 8] normal with bias on 1x1x1x4: weight shard 64 elements, bias 8; fp32 → 256 B + 32 B.
    # Buckets of 32 B, in the layout order (bias first): [32] then [256] → 2 all-reduces over d (p=4).
    from axgrid.perfmodel.comm import dp_gradient_sizes
    sizes = dp_gradient_sizes([FCLayer(8, 8, False, True)], (1, 1, 1, 4), 4)
    assert sizes == [32, 256]                              # the buckets' layout: reverse parameters() order
    two = [FCLayer(8, 8, False, True), FCLayer(4, 8, True, False)]     # second: shard 32 floats, no bias
    assert dp_gradient_sizes(two, (1, 1, 1, 4), 4) == [0, 128, 32, 256]
    calls = pm.collective_calls([FCLayer(8, 8, False, True)], (1, 1, 1, 4), 4, 1, 4, bucket_bytes=32)
    assert calls == {("d", "all_reduce"): 2 + 1}         # two buckets, then the parameters' "used" flags
    assert pm.collective_calls([FCLayer(8, 8, False, True)], (1, 1, 1, 4), 4, 1, 4, bucket_bytes=256) == \
        {("d", "all_reduce"): 1 + 1}                       # the bias' 32 B is below the limit: the weight joins
    # the whole model: time of AR_d = 2(p−1)/p·D/β + buckets·2(p−1)·α
    spec = TransformerShape("t", 1, 8, 2, seq=4, vocab=8)
    m = pm.load_machine("dgx-h100")
    a = m.placement_of("intra").alpha
    be = m.placement_of("intra").beta
    for bucket, odp in ((2**20, False), (64, False), (64, True)):
        opt = pm.Options(overlap_ar=False, overlap_rs=False, overlap_ag=False, overlap_dp=odp, recompute=False,
                         bucket_bytes=bucket, microbatches=1)
        ev = pm.evaluate(pm.Problem(spec, 4, 4, "fp32", opt), m, pm.Grids.of([(1, 1, 1, 4)]))
        from axgrid.perfmodel.comm import dp_buckets
        from axgrid.perfmodel.step import step_gradient_sizes
        sz = step_gradient_sizes(spec, (1, 1, 1, 4), 4)     # every parameter: embeddings, norms, FC
        assert sum(sz) == spec.params * 4
        nb = len(dp_buckets(sz, bucket))
        flags = 4 * sum(1 for v in sz if v > 0)               # the parameters' "used" flags: one more all-reduce
        want = 2 * 3 / 4 * (sum(sz) + flags) / be + (nb + 1) * 2 * 3 * a
        assert int(ev.extra["dp_buckets"][0]) == nb
        assert ev.raw["d"][0] == pytest.approx(want, rel=1e-12)
        if not odp:
            assert ev.exposed["d"][0] == pytest.approx(want, rel=1e-12)     # no ODP: all exposed
        else:   # ODP: at least the last bucket (posted at the end of the backward) is exposed, at most all
            last = dp_buckets(sz, bucket)[-1]
            flags_t = 2 * 3 / 4 * flags / be + 2 * 3 * a
            assert 2 * 3 / 4 * last / be + 2 * 3 * a + flags_t <= ev.exposed["d"][0] * (1 + 1e-12) <= \
                want * (1 + 1e-12)
    # the head 8·8 (64 floats = 256 B) alone exceeds 64 B: several buckets in the 64-byte case
    assert nb > 1


def test_keep_gathered_and_recompute_change_counts():
    layers = [FCLayer(6, 4, False, False)]
    base = pm.collective_calls(layers, (2, 3, 2, 1), 8, 2, 2)
    kept = pm.collective_calls(layers, (2, 3, 2, 1), 8, 2, 2, keep_gathered=True)
    rec = pm.collective_calls(layers, (2, 3, 2, 1), 8, 2, 2, recompute=True)
    assert base[("z", "all_gather")] == 4 and kept[("z", "all_gather")] == 2
    assert rec[("x", "all_reduce")] == 2 * base[("x", "all_reduce")]
    assert ("z", "all_reduce") not in base  # no bias


def test_group_of_one_posts_nothing():
    assert pm.collective_bytes([FCLayer(8, 8)], (1, 1, 1, 1), 4, 1, 2) == {}


def test_tokens_must_split():
    with pytest.raises(pm.PerfModelError, match="Gd\\*Gz"):
        pm.collective_bytes([FCLayer(8, 8)], (1, 1, 2, 2), 6, 1, 2)


def test_placement_bandwidth_link_sharing_rule():
    from dataclasses import replace
    m = replace(pm.load_machine("perlmutter"), bandwidth_table=(), inter_node_bandwidth_per_nic=25e9)   # spec only
    a, b, intra = ring_alpha_beta(np.array([4, 8, 8, 4, 2]), np.array([1, 1, 4, 2, 2]), m)
    assert intra.tolist() == [True, False, False, False, True]
    assert b[0] == 200e9                # inside a node: NVLink
    assert b[1] == pytest.approx(100e9)  # 4 members per node, 1 ring leaves each node: all 4 NICs
    assert b[2] == pytest.approx(25e9)   # 1 member per node: 4 rings share the NICs
    assert b[3] == pytest.approx(50e9)   # p=4, stride 2: 2 members per node, 2 rings share the node's NICs
    assert b[4] == 200e9                 # p=2, stride 2: ranks 0 and 2 share a node
    assert a[0] == m.intra_node_latency and a[1] == m.inter_node_latency


def test_strides_follow_rank_order():
    s = dim_strides(2, 3, 4, 5)
    assert {d: int(v[1]) for d, v in s.items()} == {"x": 1, "y": 2, "z": 6, "d": 24}
    s = dim_strides(2, 3, 4, 5, order="zyxd")
    assert {d: int(v[1]) for d, v in s.items()} == {"z": 1, "y": 4, "x": 12, "d": 24}


def test_flops_formulas():
    spec = pm.get_model("gpt-tiny")  # L=2, h=64, S=64, V=256
    assert pm.model_flops(spec, 1, True) == pytest.approx(96 * 64 * 2 * 64**2 * (1 + 64 / 384 + 256 / (16 * 2 * 64)))
    T, L, h, S, V = 64, 2, 64, 64, 256
    fwd = 24 * T * L * h * h + 4 * T * S * h * L + 2 * T * h * V   # GEMMs + attention + head, forward only
    assert pm.model_flops(spec, 1, False) == pytest.approx(3 * fwd)
    assert pm.model_flops(spec, 1, True) == pytest.approx(3 * fwd + 24 * T * L * h * h + 4 * T * S * h * L)


def test_memory_by_hand():
    """The runtime's layout (perfmodel.memory's docstring; tests/test_memory_agreement.py checks it on the runtime)."""
    spec = pm.get_model("gpt-tiny")                      # L 2, h 64, 4 heads, S 64, V 256
    opt = pm.Options(recompute=False, overlap_ag=False, overlap_rs=False)
    mem = memory_per_gpu(spec, 1, 1, 1, 1, 64, 2, False, opt)
    # fp32 weights under autocast: 4 + 4 bytes param/grad + 8 bytes AdamW moments, and a 4-byte step per tensor
    # (2 tables, 12 per block with biases, final layer norm 2, head 1)
    assert float(mem.static) == spec.params * 16 + 4 * (2 + 2 * 12 + 3)
    h, V, m = 64, 256, 64
    block = m * (8 * h + 8 + 2 * 2 * h + 2 * (3 * h + h + 8 * h) + 4 * 4)   # LN xhat+rstd, LN outs, GEMM outs, lse
    head = m * (4 * h + 4 + 2 * h) + m * (4 * V + 8) + 4                      # final LN, head input, log-softmax
    assert float(mem.block_activations) == block
    assert float(mem.activations) == 2 * block + head + 16 * m
    # Gz = 1: no gathered block (the block is the shard); Gd = 1: no bucket buffers; the largest transient here is
    # the loss gradient (two fp32 [m', V] at the log-softmax's backward)
    assert float(mem.gathered) == 0 and float(mem.dp_buckets) == 0
    assert float(mem.transient) == max(8 * m * V, float(mem.transient)) and float(mem.buffers) == float(mem.transient)
    # the embedding tables are replicated over y and z (features over x only)
    emb = (spec.vocab + spec.seq) * spec.hidden
    assert float(memory_per_gpu(spec, 1, 2, 2, 1, 64, 2, False, opt).static) >= emb * 16
    assert float(memory_per_gpu(spec, 2, 1, 1, 1, 64, 2, False, opt).static) < float(mem.static) * 0.6
    # z shards the weights: static shrinks with Gz, and gathered blocks appear, in the compute dtype (bf16 here: the
    # runtime gathers the fp32 shards as bf16 under autocast; the head's 256×64 is largest)
    z2 = memory_per_gpu(spec, 1, 1, 2, 1, 64, 2, False, opt)
    assert float(z2.static) < float(mem.static) * 0.6 and float(z2.gathered) == 256 * 64 * 2
    # Gd > 1: the gradients are the bucket buffers (one copy); zero=1 shards AdamW's moments, zero=2 the gradients
    d2 = memory_per_gpu(spec, 1, 1, 1, 2, 64, 2, False, opt)
    assert float(d2.dp_buckets) == 0 and float(d2.grads) == float(mem.grads) and float(d2.static) == float(mem.static)
    z1 = memory_per_gpu(spec, 1, 1, 1, 2, 64, 2, False, opt.with_(zero=1))
    z2 = memory_per_gpu(spec, 1, 1, 1, 2, 64, 2, False, opt.with_(zero=2))
    moments = float(mem.optimizer) - 4 * pm.memory.parameter_tensors(spec)
    assert float(z1.grads) == float(mem.grads)                      # one bucket of an even size: no padding
    assert float(z1.optimizer) == moments / 2 + 4 * pm.memory.parameter_tensors(spec)
    assert float(z2.grads) == float(mem.grads) / 2 and float(z2.optimizer) == float(z1.optimizer)
    assert float(z2.dp_buckets) == float(mem.grads)                 # one bucket, filled during the backward
    rec = memory_per_gpu(spec, 1, 1, 1, 1, 64, 2, False, opt.with_(recompute=True))
    assert float(rec.activations) < float(mem.activations) and float(rec.stored_block) == 4 * h * m


def test_the_loss_gradients_peak_holds_only_the_blocks_kept_from_the_forward():
    """Where the loss gradient (two fp32 [m', V]) is the largest transient, the peak holds the gathered blocks kept
    from the forward and no others: none without keep (the head's backward gathers after it; the dry run measures
    it, tests/ranks/test_dryrun.py), the head's with keep and recompute, every layer's with keep alone."""
    spec = pm.get_model("gpt-tiny")                      # L 2, h 64, V 256: the head's block 256×64 is the largest
    m, V, b = 4096, 256, 2
    base = pm.Options(recompute=True, overlap_ag=False, overlap_rs=False)
    z1 = memory_per_gpu(spec, 1, 1, 1, 1, m, b, False, base)
    for opt, kept in ((base, 0.0), (base.with_(keep_gathered=True), 256 * 64 * b)):
        z2 = memory_per_gpu(spec, 1, 1, 2, 1, m, b, False, opt)
        assert float(z2.gathered) > 0
        assert float(z2.total - z2.static - z2.activations) == 8 * m * V + kept
        assert float(z1.total - z1.static - z1.activations) == 8 * m * V
    keep = memory_per_gpu(spec, 1, 1, 2, 1, m, b, False, base.with_(keep_gathered=True, recompute=False))
    assert float(keep.buffers) == 8 * m * V + float(keep.gathered)


def test_enumeration_all_divisors():
    g = enumerate_grids(12)
    t = g.tuples()
    assert len(t) == len(set(t)) == 40          # ordered 4-way factorisations of 2²·3: C(5,3)·C(4,3) = 10·4
    assert all(a * b * c * d == 12 for a, b, c, d in t)
    assert (3, 1, 4, 1) in t and (1, 1, 1, 12) in t


def test_model_bytes_equal_ledger_formula():
    spec = pm.get_model("gpt-tiny")
    for grid, mb in [((2, 2, 2, 2), 2), ((1, 4, 2, 1), 1), ((2, 1, 1, 4), 2)]:
        for keep, rec in [(False, True), (True, False)]:
            opt = pm.Options(microbatches=mb, keep_gathered=keep, recompute=rec)
            prob = pm.Problem(spec, 8, 16, "bf16", opt)
            ev = pm.evaluate(prob, pm.load_machine("perlmutter"), pm.Grids.of([grid]))
            led = pm.collective_bytes(spec, grid, 8 * spec.seq // mb, mb, 2,     # the whole GPT step, gradients in fp32
                                      keep_gathered=keep, recompute=rec, grad_dtype_bytes=opt.grad_bytes,
                                      clip=opt.clip)
            for d in ("x", "y", "z", "d", "xyz"):
                assert ev.step_bytes[d][0] == sum(v for (dd, _), v in led.items() if dd == d), (grid, d)


def test_clipping_is_its_norm_all_reduces():
    """Options.clip (the drivers' --clip): one 8-byte all-reduce over the block "xyz" (a ring of Gx·Gy·Gz ranks),
    and over d with zero >= 1, priced blocking in the step time; collective_events lists them after the gradients'
    reduction and before the parameters' all-gather."""
    spec, m = pm.get_model("gpt-tiny"), pm.load_machine("perlmutter")
    grids = [(2, 2, 1, 4), (1, 1, 1, 16)]
    g = pm.Grids.of(grids)
    p = np.array([4, 1])
    a, be, _ = ring_alpha_beta(p, np.ones(2, dtype=np.int64), m)
    pd, sd = dim_strides(g.gx, g.gy, g.gz, g.gd)["d"]
    ad, bd, _ = ring_alpha_beta(pd, sd, m)
    for zero in (0, 1):
        on, off = (pm.evaluate(pm.Problem(spec, 16, 16, options=pm.Options(microbatches=1, zero=zero, clip=c)), m, g)
                   for c in (True, False))
        t_xyz = ring_time("all_reduce", p, 8, a, be)
        t_d = ring_time("all_reduce", pd, 8, ad, bd) if zero else np.zeros(2)
        assert t_xyz[0] > 0 and t_xyz[1] == 0
        assert np.allclose(on.exposed["xyz"], t_xyz, rtol=1e-12) and np.all(off.exposed["xyz"] == 0)
        assert np.allclose(on.exposed["d"] - off.exposed["d"], t_d, rtol=1e-9, atol=1e-15)
        assert np.allclose(on.time - off.time, t_xyz + t_d, rtol=1e-9)
        assert list(on.step_bytes["xyz"]) == [8, 0] and list(off.step_bytes["xyz"]) == [0, 0]
        assert list(on.step_bytes["d"] - off.step_bytes["d"]) == ([8, 8] if zero else [0, 0])
        for grid in grids:
            ev = pm.collective_events(spec, grid, 16 * spec.seq, 1, 2, zero=zero, clip=True)
            plain = pm.collective_events(spec, grid, 16 * spec.seq, 1, 2, zero=zero)
            clip = [("xyz", "all_reduce", 8)] * (grid[:3] != (1, 1, 1)) + [("d", "all_reduce", 8)] * zero
            # zero >= 1: the optimizer's step posts the "used" flags and the all-gathers, after the clipping
            late = [e for e in plain if e[:2] == ("d", "all_gather") or (zero and e[:2] == ("d", "all_reduce"))]
            assert ev == plain[:len(plain) - len(late)] + clip + late, (grid, zero)


def test_time_is_compute_plus_exposed_and_no_overlap_exposes_all():
    spec = pm.get_model("gpt-mini")
    m = pm.load_machine("perlmutter")
    g = enumerate_grids(16)
    ev = pm.evaluate(pm.Problem(spec, 32, 16), m, g)
    ok = ev.feasible
    assert ok.any()
    tot = ev.compute + sum(ev.exposed[d] for d in ("x", "y", "z", "d", "xyz"))
    assert np.allclose(ev.time[ok], tot[ok])
    off = pm.Options(overlap_ar=False, overlap_rs=False, overlap_ag=False, overlap_dp=False)
    ev0 = pm.evaluate(pm.Problem(spec, 32, 16, options=off), m, g)
    for d in "xyzd":
        assert np.allclose(ev0.exposed[d], ev0.raw[d])
    # overlaps never make a step slower
    assert np.all(ev.time[ok] <= ev0.time[ok] + 1e-12)
    no_ors = pm.evaluate(pm.Problem(spec, 32, 16, options=pm.Options(overlap_rs=False)), m, g)
    assert np.all(no_ors.time[ok] <= ev0.time[ok] + 1e-12)


def test_zero_modes_price_the_same_ring_bytes_with_another_overlap():
    """zero >= 1: reduce-scatter + all-gather over d move what one all-reduce moves (fp32: the same bytes, up to the
    padding; the same latency per bucket); zero=2 reduce-scatters in every micro-batch; with ODP the parameter
    all-gather hides under the next forward except its first bucket."""
    spec = pm.get_model("gpt-mini")
    m = pm.load_machine("perlmutter")
    g = pm.Grids.of([(1, 2, 1, 8), (2, 1, 2, 4)])
    off = pm.Options(overlap_ar=False, overlap_rs=False, overlap_ag=False, overlap_dp=False, microbatches=2,
                     bucket_bytes=2**18, clip=False)         # several buckets: ODP can hide all but one
    ev = {z: pm.evaluate(pm.Problem(spec, 32, 16, "fp32", off.with_(zero=z)), m, g) for z in (0, 1, 2)}
    assert np.allclose(ev[1].raw["d"], ev[0].raw["d"], rtol=1e-3) and np.all(ev[1].exposed["d"] == ev[1].raw["d"])
    from axgrid.perfmodel.step import step_gradient_sizes
    from axgrid.perfmodel.microbatch import Rings
    n_params = sum(1 for v in step_gradient_sizes(spec, (1, 1, 1, 2), 4) if v > 0)
    flags = Rings.of(g, off.order, m).time("all_reduce", "d", 4 * n_params)     # every mode: the "used" flags
    rs = (ev[1].raw["d"] - flags) / 2                        # half of the rest: the reduce-scatter (fp32: AG = RS)
    assert np.allclose(ev[2].raw["d"], ev[1].raw["d"] + rs, rtol=1e-3)      # one more reduce-scatter (2 mb)
    assert np.all(ev[1].step_bytes["d"] >= ev[0].step_bytes["d"])           # padding: at most Gd-1 per bucket
    odp = pm.evaluate(pm.Problem(spec, 32, 16, "fp32", off.with_(zero=1, overlap_dp=True)), m, g)
    assert np.all(odp.exposed["d"] < ev[1].exposed["d"]) and np.all(odp.exposed["d"] > 0)
    assert list(ev[2].extra["zero"]) == [2, 2]


def test_rank_chooses_the_zero_mode_per_row():
    """Options.zero None: every grid gets the fastest mode that fits (0 where Gd = 1); a grid that does not fit
    unsharded fits with its optimizer state (and gradients) sharded over d; the rows carry the mode and the band."""
    spec = pm.get_model("gpt-20b")
    m = pm.load_machine("perlmutter")
    prob = pm.Problem(spec, 64, 64, options=pm.Options(microbatches=1, zero=None))
    g = pm.enumerate_grids(64)
    auto = pm.evaluate(prob, m, g)
    each = {z: pm.evaluate(pm.Problem(spec, 64, 64, options=prob.options.with_(zero=z)), m, g) for z in (0, 1, 2)}
    times = np.stack([each[z].time for z in (0, 1, 2)])
    assert np.array_equal(auto.time, times.min(axis=0))
    assert np.all(auto.extra["zero"][g.gd == 1] == 0)
    assert np.all(each[2].memory.total[g.gd > 1] < each[1].memory.total[g.gd > 1])
    assert np.all(each[1].memory.total[g.gd > 1] < each[0].memory.total[g.gd > 1])
    rescued = auto.feasible & ~each[0].feasible
    assert rescued.any() and np.all(auto.extra["zero"][rescued] > 0)
    assert "zero=1 needs Gd > 1" in each[1].reasons[int(np.nonzero(g.gd == 1)[0][0])]
    rk = pm.rank(prob, m)
    assert any(r.zero for r in rk.feasible) and all(r.time_low <= r.time_s <= r.time_high for r in rk.feasible)
    best = rk.feasible[0]
    assert best.time_s == pytest.approx(float(pm.price_grid(pm.Problem(spec, 64, 64, options=prob.options.with_(
        zero=best.zero)), m, best.grid).time_s))


def test_cli_zero(capsys):
    """``rank --zero N`` fixes the mode (``--grid`` explains it); ``rank`` alone picks it per row and says so."""
    from axgrid.perfmodel.cli import main
    args = ["rank", "--model", "gpt-20b", "--gpus", "64", "--machine", "perlmutter", "--batch", "64"]
    assert main([*args, "--zero", "2", "--grid", "2x2x4x4"]) == 0
    out = capsys.readouterr().out
    assert "zero=2:" in out and "reduce-scattered over d (in every micro-batch" in out
    assert main([*args, "--top", "5"]) == 0
    out = " ".join(capsys.readouterr().out.split())              # the console wraps long lines
    assert "RuntimeConfig(zero=N) (per row the fastest mode that fits)" in out
