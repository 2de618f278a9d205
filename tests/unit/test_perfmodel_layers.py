"""perfmodel prices a step as a loop over the spec's layer list (``axgrid.spec.block_layers``), not over a layer order
of its own: a block with one more FC layer (a SwiGLU-style gate ``[4h, h]`` next to MLP-up) costs exactly that
layer's GEMMs, bytes and parameters more, in ``evaluate``, in the ledger replay (``perfmodel.step``) and in memory.
No torch needed."""
import numpy as np
import pytest

from axgrid import perfmodel as pm
from axgrid.perfmodel.compute import gemm_time
from axgrid.perfmodel.memory import parameter_tensors
from axgrid.perfmodel.microbatch import drain_chain, prefetch_chain
from axgrid.spec import BLOCK_MODULES, FCLayer, TransformerShape, block_layers, block_modules, fc_volumes


class GatedSpec(TransformerShape):
    """The GPT with a gate ``[4h, h]`` (normal, reading ln2's output) right after MLP-up: the one edit a new layer
    takes is to the block's layer list."""

    def block_layers(self) -> list[FCLayer]:
        layers = super().block_layers()
        at = [layer.name for layer in layers].index("up") + 1
        return layers[:at] + [FCLayer(4 * self.hidden, self.hidden, False, self.bias, "gate")] + layers[at:]


SIZES = {"layers": 3, "hidden": 64, "heads": 4, "seq": 32, "vocab": 256}
PLAIN, GATED = TransformerShape("plain", **SIZES), GatedSpec("gated", **SIZES)
GATE = FCLayer(4 * 64, 64, False, True, "gate")
MACHINE = pm.load_machine("perlmutter")         # a roofline GEMM curve: a layer's time depends on its shape only
GRIDS = [(1, 1, 1, 1), (2, 2, 2, 2), (4, 1, 2, 2), (1, 4, 1, 4), (2, 1, 4, 1)]
BATCH, MB = 16, 2


def _pair(**options) -> tuple[pm.Evaluation, pm.Evaluation]:
    prob = {"batch": BATCH, "gpus": 16, "dtype": "bf16", "options": pm.Options(microbatches=MB, **options)}
    grids = pm.Grids.of(GRIDS)
    return (pm.evaluate(pm.Problem(PLAIN, **prob), MACHINE, grids),
            pm.evaluate(pm.Problem(GATED, **prob), MACHINE, grids))


def test_block_modules_follow_the_layer_list():
    assert BLOCK_MODULES == block_modules(block_layers(64)) == ("ln1", "qkv", "proj", "ln2", "up", "down")
    assert GATED.block_modules() == ("ln1", "qkv", "proj", "ln2", "up", "gate", "down")
    assert (PLAIN.layer_norms(), GATED.layer_norms()) == (7, 7)
    assert parameter_tensors(GATED) - parameter_tensors(PLAIN) == 2 * SIZES["layers"]     # weight and bias


@pytest.mark.parametrize("recompute", [False, True])
def test_gate_adds_exactly_its_gemms(recompute):
    plain, gated = _pair(recompute=recompute)
    L = SIZES["layers"]
    for i, (gx, gy, gz, gd) in enumerate(GRIDS):
        mprime = BATCH // MB * SIZES["seq"] / (gd * gz)
        v = fc_volumes(GATE, gx, gy, gz, int(mprime))
        fwd = float(gemm_time(mprime, v.n_loc, v.k_loc, MACHINE, "bf16"))
        dx = float(gemm_time(mprime, v.k_loc, v.n_loc, MACHINE, "bf16"))
        dw = float(gemm_time(v.n_loc, v.k_loc, mprime, MACHINE, "bf16"))
        grow_fwd = gated.extra["compute_fwd"][i] - plain.extra["compute_fwd"][i]
        grow_bwd = gated.extra["compute_bwd"][i] - plain.extra["compute_bwd"][i]
        assert grow_fwd == pytest.approx(MB * L * fwd, rel=1e-9)
        assert grow_bwd == pytest.approx(MB * L * (dx + dw + (fwd if recompute else 0.0)), rel=1e-9)


@pytest.mark.parametrize("recompute,keep", [(False, False), (True, False), (True, True)])
def test_gate_adds_exactly_its_bytes_and_parameters(recompute, keep):
    plain, gated = _pair(recompute=recompute, keep_gathered=keep)
    L, b, gb = SIZES["layers"], 2, 4          # bf16 weights and activations, fp32 gradients (Options.grad_reduce)
    for i, grid in enumerate(GRIDS):
        gx, gy, gz, gd = grid
        mprime = BATCH // MB * SIZES["seq"] // (gd * gz)
        v = fc_volumes(GATE, gx, gy, gz, mprime)
        n_fwd = 1 + int(recompute)
        n_ag = n_fwd + int(not keep)
        gate = {"x": L * MB * n_fwd * v.fwd_ar * b * (gx > 1),        # forward AR over x (a normal layer)
                "y": L * MB * v.bwd_ar * b * (gy > 1),                # input-gradient AR over y
                "z": L * MB * (n_ag * v.padded * b + (v.padded + v.bias_loc) * gb) * (gz > 1),  # AG_z; RS_z, AR_z
                "d": L * (v.shard + v.bias_loc) * gb * (gd > 1)      # its gradients in the d buckets,
                + L * 2 * 4 * (gd > 1)}                               # and a "used" flag (int32) per parameter
        ledger = pm.collective_bytes(GATED, grid, BATCH // MB * SIZES["seq"], MB, b, keep_gathered=keep,
                                     recompute=recompute, grad_dtype_bytes=gb)
        for d in "xyzd":
            assert gated.step_bytes[d][i] - plain.step_bytes[d][i] == gate[d], (grid, d)
            assert gated.step_bytes[d][i] == sum(n for (dd, _), n in ledger.items() if dd == d), (grid, d)
        assert gated.memory.params[i] - plain.memory.params[i] == 4.0 * L * (v.shard + v.bias_loc)


def _walk(coll: list[float], win: list[float]) -> tuple[float, float]:
    """Event by event: collective t hides under window t−1; the first collective and the last window are alone."""
    exposed, slack = coll[0], win[-1]
    for t in range(1, len(coll)):
        exposed += max(coll[t] - win[t - 1], 0.0)
        slack += max(win[t - 1] - coll[t], 0.0)
    return exposed, slack


@pytest.mark.parametrize("blocks", [1, 2, 5])
def test_chains_match_an_event_by_event_walk(blocks):
    coll = [np.array([3.0]), np.array([1.0]), np.array([7.0])]
    win = [np.array([2.0]), np.array([4.0]), np.array([5.0])]
    head_coll, head_win = np.array([6.0]), np.array([0.5])
    # OAG: in forward order, each gather under the window of the layer before it
    exposed, slack = prefetch_chain(coll, win, blocks)
    assert (float(exposed[0]), float(slack[0])) == pytest.approx(_walk(
        [float(c[0]) for c in coll] * blocks, [float(w[0]) for w in win] * blocks))
    # ORS: in backward order (the head, then the blocks' layers last to first), each under the next window
    exposed, slack = drain_chain(coll, win, blocks, head_coll, head_win)
    order_c = [6.0] + [float(c[0]) for c in reversed(coll)] * blocks
    order_w = [0.5] + [float(w[0]) for w in reversed(win)] * blocks
    want_exposed, want_slack = _walk(order_c[::-1], order_w[::-1])     # reversed: under the window after it
    assert (float(exposed[0]), float(slack[0])) == pytest.approx((want_exposed, want_slack))
