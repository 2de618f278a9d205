"""``RuntimeConfig(zero=1|2)``: the optimizer state (and with 2 the gradients) sharded over d gives the unsharded
optimizer's results -- the serial model trained on the whole batch -- to float tolerance on every 4- and 8-rank
grid with Gd > 1, with and without ODP (the reduce-scatters in the backward, the parameter all-gathers in flight
into the next forward, with ORS and OAG's prefetch) and micro-batches; the global gradient norm the clip uses
counts every element once; every rank holds only its share of the optimizer state. Bad input: ``zero`` > 0 with
Gd = 1 is refused by ``axgrid.init``, and ``shard_optimizer`` refuses an optimizer with state or foreign tensors.

AdamW runs with ``eps=1e-5``: with the default 1e-8 an element whose gradient is near zero moves by ``lr`` times the
sign of its rounding error, which makes any two summation orders (zero=2 sums micro-batches after the mean over d,
the others before) differ by up to ``lr`` there.
"""
from __future__ import annotations

import pytest
import torch

import axgrid
from axgrid.io import part_of_dense
from axgrid.spec import GridError, TransformerShape

SIZES = dict(layers=1, hidden=16, heads=4, seq=8, vocab=32)
SHAPE = TransformerShape("test", **SIZES)
SEQS = 2                  # sequences per z-rank per micro-batch
STEPS = 2
BUCKET = 2048             # bytes: a few buckets per model


def _opt(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2, eps=1e-5)


def _batches(gd: int, gz: int, micro: int) -> list[torch.Tensor]:
    """The global batch of each step: ``micro`` micro-batches of ``gd`` d-slices of ``SEQS·gz`` sequences."""
    rows = micro * gd * SEQS * gz
    return [torch.randint(0, SIZES["vocab"], (rows, SIZES["seq"] + 1), generator=torch.Generator().manual_seed(s))
            for s in range(STEPS)]


def _serial(gd: int, gz: int, micro: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The reference: the serial GPT and an unsharded AdamW on the whole batch (grad norms, parameters)."""
    from axgrid.models.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(SHAPE), None)
    opt = _opt(model)
    per = gd * SEQS * gz
    norms = []
    for ids in _batches(gd, gz, micro):
        def loss_of(i: int) -> torch.Tensor:
            rows = ids[i * per:(i + 1) * per]
            return model(rows[:, :-1], rows[:, 1:], normalizer=float(ids[:, 1:].numel()))
        norms.append(axgrid.train_step(model, opt, loss_of, None, micro, clip=0.5).grad_norm)
    return norms, {n: p.detach().clone() for n, p in model.named_parameters()}


def _sharded(spec: str, zero: int, overlap: str, micro: int) -> dict:
    from axgrid.models.gpt import GPT, GPTConfig
    cfg = axgrid.RuntimeConfig(timeout_s=60, seed=0, zero=zero, bucket_bytes=BUCKET,
                               overlap=axgrid.OverlapConfig.parse(overlap))
    grid = axgrid.init(spec, config=cfg)
    try:
        model = GPT(GPTConfig(SHAPE), grid)
        grid.watch(model)
        opt = axgrid.shard_optimizer(_opt(model), model, grid)
        gd, gz, d = grid.size("d"), grid.size("z"), grid.index("d")
        per = SEQS * gz
        norms = []
        for ids in _batches(gd, gz, micro):
            def loss_of(i: int) -> torch.Tensor:
                rows = ids[(i * gd + d) * per:(i * gd + d + 1) * per]
                return model(rows[:, :-1], rows[:, 1:], normalizer=float(ids[:, 1:].numel()) / gd)
            norms.append(axgrid.train_step(model, opt, loss_of, grid, micro, clip=0.5).grad_norm)
        lay = opt.buckets
        gathering = len(lay.gathers)                     # ODP: the parameter all-gathers stay in flight ...
        with torch.no_grad():
            model(ids[:per, :-1])                        # ... until the modules that use them run
        gathering = (gathering, len(lay.gathers))
        axgrid.finish_gradients(grid)
        state = sum(v.numel() for st in opt.state.values() for k, v in st.items() if k != "step")
        return {"norms": norms, "gathering": gathering, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "tiles": {n: getattr(p, "axgrid_tile", None) for n, p in model.named_parameters()},
                "state": state, "elements": sum(p.numel() for p in model.parameters()),
                "empty": grid.runtime.dp.empty() and grid.runtime.grads.empty()}
    finally:
        grid.destroy()


def rank_cases(cases: list[tuple]) -> list[dict]:
    torch.set_num_threads(1)
    return [_sharded(*c) for c in cases]


def rank_bad_input() -> list[str]:
    """One line per refusal, on every rank, before any collective."""
    out = []
    try:
        axgrid.init("2x2x1x1", config=axgrid.RuntimeConfig(timeout_s=60, zero=2))
    except GridError as e:
        out.append(str(e))
    grid = axgrid.init("1x1x2x2", config=axgrid.RuntimeConfig(timeout_s=60, seed=0, zero=1))
    try:
        from axgrid.models.gpt import GPT, GPTConfig
        model = GPT(GPTConfig(SHAPE), grid)
        for bad in (torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))]), "state"):
            if bad == "state":
                bad = _opt(model)
                bad.state[next(model.parameters())]["step"] = torch.tensor(1.0)
            try:
                axgrid.shard_optimizer(bad, model, grid)
            except ValueError as e:
                out.append(str(e))
    finally:
        grid.destroy()
    return out


# (grid, zero, overlap, micro-batches): every grid with Gd > 1 in both modes, ODP and micro-batches varied
CASES_4 = [("1x1x1x4", 1, "none", 2), ("1x1x1x4", 2, "odp", 2), ("2x1x1x2", 1, "odp", 1), ("2x1x1x2", 2, "none", 2),
           ("1x2x1x2", 1, "none", 1), ("1x2x1x2", 2, "all", 1), ("1x1x2x2", 1, "all", 2), ("1x1x2x2", 2, "none", 1)]
GRIDS_8 = ["4x1x1x2", "1x4x1x2", "1x1x4x2", "2x2x1x2", "2x1x2x2", "1x2x2x2", "2x1x1x4", "1x2x1x4", "1x1x2x4",
           "1x1x1x8"]
CASES_8 = [(g, z, ("all" if (i + z) % 2 else "none"), 1 + (i + z) % 2) for i, g in enumerate(GRIDS_8) for z in (1, 2)]


def _check(world: int, cases: list[tuple], ranks) -> None:
    per_rank = ranks(world, rank_cases, cases)
    refs = {}
    for i, (spec, zero, overlap, micro) in enumerate(cases):
        gx, gy, gz, gd = (int(v) for v in spec.split("x"))
        key = (gd, gz, micro)
        if key not in refs:
            refs[key] = _serial(gd, gz, micro)
        norms, dense = refs[key]
        states = []
        for r, results in enumerate(per_rank):
            got = results[i]
            where = f"{spec} zero={zero} overlap={overlap} micro={micro} rank {r}"
            assert got["empty"], f"{where}: collectives left in flight"
            odp = axgrid.OverlapConfig.parse(overlap).odp
            assert (got["gathering"][0] > 0) == odp and got["gathering"][1] == 0, (where, got["gathering"])
            torch.testing.assert_close(torch.tensor(got["norms"]), torch.tensor(norms), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{where}: gradient norms differ from the serial run: {m}")
            for name, p in got["params"].items():
                tile = got["tiles"][name]
                want = part_of_dense(tile, dense[name]) if tile is not None else dense[name]
                torch.testing.assert_close(p, want, rtol=1e-4, atol=2e-5,
                                           msg=lambda m: f"{where}: {name} differs from the serial run: {m}")
            states.append(got["state"])
        # each rank keeps AdamW's two moments for its share only: the d-ranks of one tensor-parallel position
        # together hold them once for every element
        block = gx * gy * gz
        for r in range(block):
            held = sum(states[r + d * block] for d in range(gd))
            assert held == 2 * per_rank[r][i]["elements"] and max(states) < held, (spec, states)


def test_zero_equals_unsharded_on_4_ranks(ranks):
    _check(4, CASES_4, ranks)


@pytest.mark.slow
def test_zero_equals_unsharded_on_8_ranks(ranks):
    _check(8, CASES_8, ranks)


def test_zero_bad_input(ranks):
    for lines in ranks(4, rank_bad_input):
        assert len(lines) == 3, lines
        assert "zero=2" in lines[0] and "Gd = 1" in lines[0] and "use zero=0" in lines[0]
        assert "not a trainable parameter of the model" in lines[1]
        assert "has state already" in lines[2]
        assert all("\n" not in line for line in lines)


def _resumable(spec: str, zero: int, overlap: str, path: str, save_at: int = 0) -> dict:
    """Train ``STEPS`` + 2 steps on one global batch schedule (with ``save_at``: save after that many steps, keep
    going), or resume from ``path`` and train the last 2; the gradient norms of the steps run."""
    from axgrid.checkpoint import load_checkpoint, save_checkpoint
    from axgrid.models.gpt import GPT, GPTConfig
    cfg = axgrid.RuntimeConfig(timeout_s=60, seed=0, zero=zero, bucket_bytes=BUCKET,
                               overlap=axgrid.OverlapConfig.parse(overlap))
    grid = axgrid.init(spec, config=cfg)
    try:
        model = GPT(GPTConfig(SHAPE), grid)
        opt = axgrid.shard_optimizer(_opt(model), model, grid)
        gd, gz, d = grid.size("d"), grid.size("z"), grid.index("d")
        start, info = 0, None
        if not save_at:
            info = load_checkpoint(path, model, opt, grid)
            start = info.step
        out = {"norms": [], "zero_saved": info.saved_zero if info else None}
        for step in range(start, STEPS + 2):
            ids = torch.randint(0, SIZES["vocab"], (4 * SEQS, SIZES["seq"] + 1),       # 8 sequences on every grid
                                generator=torch.Generator().manual_seed(step))
            per = len(ids) // gd

            def loss_of(i: int) -> torch.Tensor:
                rows = ids[d * per:(d + 1) * per]
                return model(rows[:, :-1], rows[:, 1:], normalizer=float(ids[:, 1:].numel()) / gd)
            out["norms"].append(axgrid.train_step(model, opt, loss_of, grid, 1, clip=0.5).grad_norm)
            if step + 1 == save_at:
                save_checkpoint(path, model, opt, grid, step=save_at)
        return out
    finally:
        grid.destroy()


def rank_checkpoints(path: str) -> dict:
    """A zero=2 checkpoint of a 1x1x1x4 run, resumed on another Gd (zero=1), onto zero=0, and by a reader of
    another format version."""
    import json
    import os

    from axgrid.checkpoint import CheckpointError
    torch.set_num_threads(1)
    out = {"saved": _resumable("1x1x1x4", 2, "odp", path, save_at=STEPS)}
    for spec, zero in (("2x1x1x2", 1), ("1x1x1x4", 0), ("1x2x1x2", 2)):
        out[(spec, zero)] = _resumable(spec, zero, "none", path)
    torch.distributed.barrier()
    man = os.path.join(path, f"step-{STEPS:08d}", "manifest.json")
    if torch.distributed.get_rank() == 0:
        with open(man) as f:
            doc = json.load(f)
        doc["version"] = 2                                  # as a later format would write it
        with open(man, "w") as f:
            json.dump(doc, f)
    torch.distributed.barrier()
    try:
        _resumable("1x1x1x4", 2, "none", path)
    except CheckpointError as e:
        out["newer"] = str(e)
    return out


@pytest.mark.slow
def test_zero_checkpoints_reshard_and_load_onto_zero_0(ranks, tmp_path):
    for out in ranks(4, rank_checkpoints, str(tmp_path / "ck")):
        want = out["saved"]["norms"][STEPS:]
        for key in (("2x1x1x2", 1), ("1x1x1x4", 0), ("1x2x1x2", 2)):
            assert out[key]["zero_saved"] == 2
            torch.testing.assert_close(torch.tensor(out[key]["norms"]), torch.tensor(want), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"resumed on {key}: {m}")
        assert "format version 2, this axgrid reads version 1" in out["newer"] and "\n" not in out["newer"]
