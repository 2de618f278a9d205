"""Command line: ``python -m axgrid.perfmodel {rank, machines, calibrate, validate, check-published,
validate-public}``."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from axgrid.spec import CONFIG_SEQ, GridError, GridShape, TransformerShape, is_config_path
from axgrid.spec.layout import WorldSizeMismatch

from .context_parallel import check as check_cp
from .errors import PerfModelError
from .machines import list_machines, load_gemm_table, load_machine
from .rank import Ranking, price_grid, rank
from .suites import SUITES
from .problem import DTYPE_BYTES, Options, Problem, get_model


def add_problem_args(p: argparse.ArgumentParser) -> None:
    """The problem's arguments (model, GPUs, machine, batch, dtype, options): rank/validate here, and
    python -m axgrid.measure steps, which times the same problem."""
    p.add_argument("--model", help="a named model: a GPT size (gpt-tiny … gpt-1t) or a public model (llama-3.1-8b, "
                                   "mistral-7b, qwen2.5-7b, …); a config.json path works too; or give --config, or "
                                   "--layers/--hidden/--heads")
    p.add_argument("--config", help="a Hugging Face config.json (or its folder) of a family the runtime trains")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--seq", type=int, help="sequence length (overrides the named model's)")
    p.add_argument("--vocab", type=int, help="vocabulary size (overrides the named model's)")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--machine", required=True, help="machine name or path to a .toml")
    p.add_argument("--batch", type=int, required=True, help="global batch in sequences")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPE_BYTES))
    p.add_argument("--grad-reduce", default="fp32", choices=list(DTYPE_BYTES),
                   help="dtype of the gradient reductions (RuntimeConfig.grad_reduce_dtype; default fp32)")
    p.add_argument("--microbatches", type=int, help="fixed micro-batch count (default: fewest that fit)")
    for name in ("oar", "ors", "oag", "odp"):
        p.add_argument(f"--no-{name}", action="store_true", help=f"turn the {name.upper()} overlap off")
    p.add_argument("--no-recompute", action="store_true", help="no activation recompute")
    p.add_argument("--keep-gathered", action="store_true", help="keep gathered weights from forward to backward")
    p.add_argument("--order", default="xyzd", help="rank order, fastest first (default xyzd)")
    p.add_argument("--zero", choices=("0", "1", "2", "auto"), default="0",
                   help="the runtime's RuntimeConfig.zero for 4D grids: 1 shards AdamW's state over d, 2 also the "
                        "gradients; auto: each grid gets the fastest mode that fits (rank's default)")
    p.add_argument("--bucket-mib", type=float, default=25.0,
                   help="data-parallel gradient bucket in MiB (the runtime's RuntimeConfig.bucket_bytes; default 25)")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA adapters of this rank (axgrid.lora), the base frozen: "
                   "memory and collectives priced as perfmodel.lora says (the time is still the full step's); "
                   "0 (default): full training")
    p.add_argument("--lora-targets", help="comma-separated FC layers to adapt (qkv, proj, up, down, head; default: "
                   "the four of the block)")
    p.add_argument("--cp", default="1", help="context parallelism (axgrid.init(..., cp=N)): each sequence split over "
                   "N z-ranks; an int, or auto: rank searches every size that cuts the sequence into 2·N chunks "
                   "(default 1: none)")
    p.add_argument("--cp-exchange", default="all_gather", choices=("all_gather", "ring"),
                   help="how attention exchanges keys and values under --cp (the GPT's GPTConfig.cp_exchange; a "
                        "Hugging Face decoder's plan all-gathers)")
    p.add_argument("--gemm-table", help="JSON GEMM efficiency table (python -m axgrid.kernels export-efficiency FILE)")


def _bucket_bytes(mib: float) -> int:
    if not mib > 0:
        raise PerfModelError(f"--bucket-mib must be > 0, got {mib}")
    return max(1, int(round(mib * 2**20)))


POSITIVE_ARGS = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "batch", "microbatches")


def check_positive(a: argparse.Namespace, names: tuple[str, ...] = POSITIVE_ARGS) -> None:
    """Refuse a given size that is zero or negative (rather than silently falling back to a default)."""
    for name in names:
        v = getattr(a, name, None)
        if v is not None and v <= 0:
            flag = "--" + name.replace("_", "-")
            raise PerfModelError(f"{flag} must be a positive integer, got {v}")


def problem_from_args(a: argparse.Namespace) -> tuple[Problem, "object"]:
    check_positive(a)
    config = getattr(a, "config", None) or (a.model if a.model and is_config_path(a.model) else None)
    if config and a.model and config != a.model:
        raise PerfModelError(f"give --model {a.model} or --config {config}, not both")
    if config:
        try:
            spec = TransformerShape.from_config_json(config, a.seq or CONFIG_SEQ)
        except ValueError as e:
            raise PerfModelError(str(e)) from None
    elif a.model:
        spec = get_model(a.model)
    elif a.layers and a.hidden and a.heads:
        try:
            spec = TransformerShape("custom", a.layers, a.hidden, a.heads)
        except ValueError as e:
            raise PerfModelError(str(e)) from None
    else:
        raise PerfModelError("give --model NAME, --config path/to/config.json, or all of --layers, --hidden, --heads")
    if a.seq is not None or a.vocab is not None:
        spec = replace(spec, seq=a.seq or spec.seq, vocab=a.vocab or spec.vocab)
    opt = Options(overlap_ar=not a.no_oar, overlap_rs=not a.no_ors, overlap_ag=not a.no_oag,
                  overlap_dp=not a.no_odp, recompute=not a.no_recompute, keep_gathered=a.keep_gathered,
                  microbatches=a.microbatches, order=a.order, bucket_bytes=_bucket_bytes(a.bucket_mib),
                  grad_reduce=getattr(a, "grad_reduce", "fp32"), zero=None if a.zero == "auto" else int(a.zero),
                  lora_r=getattr(a, "lora_r", 0) or 0, lora_targets=_lora_targets(spec, a),
                  cp=1 if _cp_arg(a) == "auto" else _cp_arg(a), cp_exchange=getattr(a, "cp_exchange", "all_gather"))
    machine = load_machine(a.machine)
    if a.gemm_table:
        machine = replace(machine, gemm_table=load_gemm_table(a.gemm_table))
    return Problem(spec, a.batch, a.gpus, a.dtype, opt), machine


def split_cp(grid: str) -> tuple[str, int]:
    """A grid string with an optional ``+cpN`` (``1x1x8x8+cp8``, as a ranked row prints it): (the grid, N or 1)."""
    base, _, cp = grid.partition("+cp")
    if _ and (not cp.isdigit() or int(cp) < 1):
        raise PerfModelError(f"grid {grid!r}: the context-parallel size after '+cp' must be an int >= 1, e.g. "
                             f"{base}+cp2")
    return base, int(cp) if _ else 1


def _cp_arg(a: argparse.Namespace) -> int | str:
    """``--cp``: an int >= 1 or "auto" (a one-line PerfModelError otherwise)."""
    given = str(getattr(a, "cp", "1") or "1")
    if given == "auto":
        return given
    if not given.isdigit() or int(given) < 1:
        raise PerfModelError(f"--cp {given!r}: give the context-parallel size (an int >= 1) or auto")
    return int(given)


def _lora_targets(spec: TransformerShape, a: argparse.Namespace) -> tuple[str, ...] | None:
    """``--lora-targets`` checked against the model's FC layers (None: the default); only with ``--lora-r``."""
    given = getattr(a, "lora_targets", None)
    if given and not getattr(a, "lora_r", 0):
        raise PerfModelError(f"--lora-targets {given} without --lora-r: give the adapters' rank")
    if not given:
        return None
    from .lora import lora_targets
    return lora_targets(spec, [t.strip() for t in given.split(",") if t.strip()])


def print_ranking(rk: Ranking, top: int, show_infeasible: int, layouts: str = "all") -> None:
    """The ranking as a table of the ``top`` rows of ``layouts`` (:meth:`Ranking.shown`; ``#`` is the row number
    ``--explain`` and ``--emit-slurm`` use), in units that suit the machine, with what the numbers mean below."""
    from rich.console import Console
    from rich.table import Table

    from .rank import verdict
    from .units import count, device_word, flops_unit, memory_unit, time_unit

    p, m = rk.problem, rk.machine
    rows = rk.shown(layouts)[:top]
    dev = device_word(m)
    tu, tf = time_unit(r.time_s for r in rows)
    fu, ff = flops_unit(r.tflops_per_gpu for r in rows)
    mu, mf = memory_unit(r.memory_bytes for r in rows)
    which = {"all": "4D grids (axgrid runs them) and Megatron-style TP×PP×DP (priced for comparison) ranked together",
             "4d": "4D grids, the layouts axgrid runs",
             "tpppdp": "Megatron-style TP×PP×DP only (priced for comparison: axgrid has no pipeline parallelism)"}
    lora = (f", LoRA r={p.options.lora_r} (memory and collectives LoRA's, the time the full step's)"
            if p.options.lora_r else "")
    t = Table(title=f"{p.model.name} ({count(p.model.params)} params), batch {p.batch}×{p.model.seq}, {p.gpus} × "
                    f"{m.gpu or m.name} ({m.name}), {p.dtype}, overlap {p.options.overlap_spec()}{lora}: "
                    f"{which[layouts]}")
    width = max([len(r.grid_str) for r in rows] + [6])
    cps = any(r.cp > 1 for r in rows)                    # context parallelism: its exposed exchange, column c
    width = max([len(r.config_str) for r in rows] + [6])
    for c in ("#", "config", "axgrid", f"{tu}/batch", f"band {tu}", "", f"{fu}/{dev}", "%peak", f"{mu}/{dev}", "mb",
              "compute", "x", "y", "z", "d", *(("c",) if cps else ()), "bubble", "p2p"):
        t.add_column(c, justify="right", no_wrap=True, min_width=width if c == "config" else None)

    def sec(v: float) -> str:
        return f"{v * tf:.3f}" if tu == "s" else f"{v * tf:.2f}"

    for i, r in enumerate(rows, 1):
        pipe = r.layout != "4D"
        mark = ("≈" if r.within_error else "") + ("†" if r.out_of_range else "")
        name = r.config_str + (f" zero{r.zero}" if r.zero else "")
        t.add_row(str(i), name, "no" if pipe else "yes", sec(r.time_s),
                  f"{r.time_low * tf:.3g}–{r.time_high * tf:.3g}", mark,
                  f"{r.tflops_per_gpu:.1f}" if ff == 1 else f"{r.tflops_per_gpu * ff:.3g}",
                  f"{r.pct_peak:.1f}", f"{r.memory_bytes / mf:.1f}", str(r.microbatches), sec(r.compute_s),
                  *(sec(r.exposed_s[d]) for d in "xyzd"), *((sec(r.exposed_s.get("c", 0.0)),) if cps else ()),
                  sec(r.bubble_s) if pipe else "-", sec(r.p2p_s) if pipe else "-")
    from rich.measure import Measurement
    con = Console(width=max(150, Console().width))
    big = Console(width=10_000)
    wide = Console(width=max(con.width, Measurement.get(big, big.options, t).maximum))
    wide.print(t)                       # as wide as it needs: no name or number is cut
    n_bad = len(rk.rows) - len(rk.feasible)
    n_mf = sum(r.feasible for r in rk.megatron)
    con.print(f"4D: {len(rk.feasible)} feasible of {len(rk.rows)} factorisations ({n_bad} rejected); TP×PP×DP: "
              f"{n_mf} feasible of {len(rk.megatron)} (TP inside a node, distributed optimizer, micro-batch of "
              f"1/2/4/8 sequences, VPP 1/2/4, sequence parallel on/off). Exposed communication after overlap "
              f"per dimension ({tu}; TP×PP×DP: TP is y, DP is d); bubble and p2p: pipeline only. zeroN: "
              f"the 4D row runs with RuntimeConfig(zero=N) ("
              f"{'per row the fastest mode that fits' if p.options.zero is None else 'fixed by --zero'}).")
    con.print("axgrid: yes = axgrid runs this grid (train_gpt.py --grid G; --emit-slurm writes its sbatch script); "
              "no = a TP×PP×DP layout, priced only to compare (axgrid has no pipeline parallelism; "
              "--layouts 4d shows the 4D grids alone).")
    if p.model.is_moe:
        con.print(f"{p.model.name} is a mixture of experts ({p.model.experts} experts, {p.model.top_k} per token): "
                  f"/epN = N-way expert parallelism inside d (perfmodel.moe: uniform routing); TP×PP×DP is not "
                  f"priced for it.")
    con.print(m.elementwise_note())
    if rk.band is not None:
        con.print(f"band: {rk.band.describe()}. ≈ = within model error of the best row (bands overlap).")
        for why in dict.fromkeys(r.out_of_range for r in rows if r.out_of_range):
            con.print(f"† outside the validated range: {why}")
        if len(rows) > 1 and all(r.within_error for r in rows):
            con.print(f"Every row shown is within the model's error band of the best: on {m.name} the model cannot "
                      f"order them. A calibration measured on {m.name} would: run `python -m axgrid.measure "
                      f"collectives` and `... steps` there, then `perfmodel calibrate` and `perfmodel validate "
                      f"--write-residuals` (docs/perfmodel.md, calibrating and validating on your machine); until "
                      f"then time the first rows yourself (--emit-slurm).")
    line = verdict(rk, layouts)
    if line:
        con.print(line, soft_wrap=True)
    if show_infeasible:
        bad = [r for r in rk.rows if not r.feasible][:show_infeasible]
        for r in bad:
            con.print(f"  rejected {r.grid_str}: {r.reason}")


def _output(what: str, path: str, write) -> None:
    """Run ``write(path)``; an unwritable path is a one-line PerfModelError naming it."""
    try:
        write(path)
    except OSError as e:
        raise PerfModelError(f"cannot write {what} to {path!r}: {e.strerror or e}; choose a writable path") from None


def parse_grid(text: str, gpus: int | None = None) -> tuple[int, int, int, int]:
    """"2x4x8x16" → (2, 4, 8, 16) (``"2x4x8"`` with ``gpus``: Gd inferred; four sizes must have ``gpus`` ranks where
    it is given), read by ``axgrid.spec.GridShape.parse``, the one grammar of a grid."""
    try:
        return GridShape.parse(text, gpus).as_tuple()
    except WorldSizeMismatch as e:
        raise PerfModelError(f"--grid {text} has {e.shape.size} ranks, not --gpus {gpus}: give a grid of {gpus} ranks, "
                             f"or three sizes GXxGYxGZ (Gd = --gpus / (Gx*Gy*Gz))") from None
    except GridError as e:
        raise PerfModelError(f"--grid {text}: {e}") from None


def cmd_rank(a: argparse.Namespace) -> int:
    from .explain import explain

    prob, machine = problem_from_args(a)
    named = [f for f in ("tp", "pp", "dp") if getattr(a, f) is not None]
    check_positive(a, ("tp", "pp", "dp", "vpp", "mbs", "top"))
    if a.grid and named:
        raise PerfModelError("give either --grid or --tp/--pp/--dp, not both")
    one = "--grid" if a.grid else ("--tp/--pp/--dp" if named else "")
    outputs = [f for f, v in (("--csv", a.csv), ("--json", a.json), ("--explain", a.explain),
                              ("--emit-slurm", a.emit_slurm)) if v]
    if one and outputs:      # they would be silently skipped: one configuration is priced, no ranking is built
        raise PerfModelError(f"{' and '.join(outputs)} work(s) on the full ranking, not with {one} (which prices one "
                             f"configuration and prints its breakdown): drop one or the other")
    if a.show_infeasible < 0:
        raise PerfModelError(f"--show-infeasible {a.show_infeasible}: give the number of rejected grids to list (>= 0)")
    single = [f for f, v in (("--vpp", a.vpp), ("--sp", a.sp), ("--mbs", a.mbs),
                             ("--recompute-mode", a.recompute_mode)) if v]
    if single and not named:
        raise PerfModelError(f"{' and '.join(single)} describe(s) one TP×PP×DP configuration: give --tp/--pp/--dp "
                             f"with it (the ranking already tries VPP 1/2/4, micro-batch sizes 1/2/4/8 and SP)")
    if a.ep is not None and not a.grid:
        raise PerfModelError(f"--ep {a.ep} prices one grid's expert-parallel size: give --grid with it (the ranking "
                             f"tries every EP size)")
    if a.grid:
        grid, cp = split_cp(a.grid)
        if cp > 1:
            prob = replace(prob, options=prob.options.with_(cp=cp))
        check_cp(prob.model, prob.options.cp, prob.options.cp_exchange)
        grid = parse_grid(grid, prob.gpus)
        from .moe import ep_reasons
        bad = ep_reasons(prob.model, grid[3], 1 if a.ep is None else a.ep)
        if bad:
            raise PerfModelError(f"--ep {a.ep} with --grid {a.grid}: {'; '.join(bad)}")
        print(explain(prob, machine, price_grid(prob, machine, grid, 1 if a.ep is None else a.ep)))
        return 0
    if named and prob.model.is_moe:
        raise PerfModelError(f"{prob.model.name} is a mixture of experts: TP×PP×DP prices dense MLPs only; price a "
                             f"4D grid with --grid and --ep")
    if named:
        from .pipeline import price_named
        tp, pp = a.tp or 1, a.pp or 1
        dp = a.dp if a.dp is not None else prob.gpus // (tp * pp)
        if tp * pp * dp != prob.gpus:
            raise PerfModelError(f"TP·PP·DP = {tp}·{pp}·{dp} = {tp * pp * dp} is not --gpus {prob.gpus}")
        from .band import banded
        row = banded(price_named(prob, machine, tp, pp, dp, a.vpp or 1, a.sp, a.mbs, a.recompute_mode), machine,
                     prob.gpus)
        print(explain(prob, machine, row))
        return 0
    from .rank import context_parallel_sizes
    auto = _cp_arg(a) == "auto"
    check_cp(prob.model, prob.options.cp, prob.options.cp_exchange)
    rk = rank(prob, machine, cp_sizes=context_parallel_sizes(prob) if auto else None)
    if a.verify is not None:
        from .verify import verify_rows, verify_table
        if a.verify < 1:
            raise PerfModelError(f"--verify {a.verify}: give the number of top 4D rows to dry-run (>= 1)")
        verified = verify_rows(prob, a.machine, rk.feasible[:a.verify])
        print(verify_table(verified, machine.memory_bytes))
        return 0 if all(v.fits and v.bytes_equal for v in verified) else 1
    if a.csv:
        _output("the CSV", a.csv, rk.to_csv)
    if a.json:
        _output("the JSON", a.json, rk.to_json)
    shown = rk.shown(a.layouts)
    if a.explain:
        if not 1 <= a.explain <= len(shown):
            raise PerfModelError(f"--explain N needs 1 ≤ N ≤ {len(shown)} (the feasible rows of --layouts "
                                 f"{a.layouts})")
        print(explain(prob, machine, shown[a.explain - 1], position=a.explain))
    else:
        print_ranking(rk, a.top, a.show_infeasible, a.layouts)
    if a.emit_slurm:
        from .slurm import emit_slurm
        written: list = []
        argv = "python -m axgrid.perfmodel " + " ".join(a.argv)
        _output("sbatch scripts", a.emit_slurm, lambda d: written.extend(emit_slurm(rk, d, shown[:a.top], argv)))
        for f in written:
            print(f"wrote {f}")
    return 0


def cmd_machines(a: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="machines")
    for c in ("name", "GPU", "GPUs/node", "bf16 TFLOP/s", "fp32 TFLOP/s", "GiB", "intra GB/s", "NICs×GB/s",
              "bw table rows", "bf16 GEMM eff", "calibrated", "file"):
        t.add_column(c)
    for m in list_machines():
        t.add_row(m.name, m.gpu, str(m.gpus_per_node), f"{m.peak_flops_bf16 / 1e12:g}",
                  f"{m.peak_flops_fp32 / 1e12:g}", f"{m.memory_bytes / 2**30:g}", f"{m.intra_node_bandwidth / 1e9:g}",
                  f"{m.nics_per_node}×{m.inter_node_bandwidth_per_nic / 1e9:g}", str(len(m.bandwidth_table) or "-"),
                  f"{m.gemm_curve('bf16').eff_max:.2f}", ",".join(m.placement) or "-", m.source.split("/")[-1])
    Console(width=160).print(t)
    return 0


def cmd_calibrate(a: argparse.Namespace) -> int:
    from . import calibrate as cal

    if not a.samples:
        raise PerfModelError("calibrate fits measured samples: give --samples FILE.json, written by `"
                             + cal.MEASURE_COMMAND.format(path="FILE.json") + "`")
    samples = cal.load_samples(a.samples)
    comm, gemm = samples.comm, samples.gemm
    ranks = a.ranks or samples.nranks
    peak = a.peak or max((2.0 * g.m * g.n * g.k / g.seconds for g in gemm), default=1e11)
    base = load_machine(a.base) if a.base else cal.local_base(ranks, peak)
    m = cal.calibrate(comm, gemm, base, name=a.name, out=a.out, peak=peak)
    fitted = cal.fit_placements(comm, base.gpus_per_node)
    errs = dict(cal.fit_report(comm, m))
    for cls, pl in m.placement.items():
        tag = f"(fit rel. RMS error {100 * errs[cls]:.0f}%)" if cls in fitted else "(not measured: base value)"
        print(f"{cls}: alpha {pl.alpha * 1e6:.1f} us, beta {pl.beta / 1e9:.3f} GB/s {tag}")
    if comm:
        print("per (group size, stride), diagnostic:")
        for (p_, s_), pl in cal.fit_by_group(comm).items():
            print(f"  p={p_} stride={s_}: alpha {pl.alpha * 1e6:.1f} us, beta {pl.beta / 1e9:.3f} GB/s")
    print(f"GEMM curve: eff_max {m.gemm_eff_max:.3f}, dim_half {m.gemm_dim_half:.1f} (peak {peak / 1e9:.1f} GFLOP/s "
          f"per rank, {len(gemm)} shapes in the table)")
    print(f"wrote {a.out}")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    from . import validate as val

    prob, machine = problem_from_args(a)
    if not a.measured:
        raise PerfModelError("validate compares with measured step times: give --measured FILE.json, written by `"
                             + val.MEASURE_COMMAND.format(gpus=prob.gpus, path="FILE.json") + "` (or a CSV grid,seconds)")
    rk = rank(prob, machine)
    measured = val.load_measured(a.measured, prob)
    meta = {**val.problem_meta(prob), "machine": machine.name, "measured_from": a.measured}
    res = val.validate_measured(rk, measured, a.out_dir, meta)
    print(f"n={res['n']}  Spearman rho={res['spearman']:.3f}  Kendall tau={res['kendall']:.3f}  "
          f"top-1 regret={res['top1_regret']:.3f}  MAPE={res['mape']:.1f}%  (CSV/plot in {a.out_dir})")
    if a.write_residuals:
        print(f"wrote {val.write_validated_residuals(rk, measured)}")
    return 0


def cmd_check_published(a: argparse.Namespace) -> int:
    from .published import TOLERANCE, check_all

    checks = check_all()
    print(f"{'point':26} {'layout':8} {'GPUs':>6} {'published':>10} {'predicted':>10} {'ratio':>6}  {'top 5':6} "
          f"predicted config")
    for c in checks:
        p, r = c.point, c.predicted
        top5 = "n/a" if c.top5 is None else ("yes" if c.top5 else "no")
        pub, pred = ((f"{p.seconds:9.2f}s", f"{r.time_s:9.2f}s") if p.seconds is not None
                     else (f"{p.tflops_per_gpu:10.1f}", f"{r.tflops_per_gpu:10.1f}"))
        note = f"; {c.memory_note}" if c.memory_note else ""
        print(f"{p.name:26} {p.layout:8} {p.gpus:6d} {pub} {pred} {c.ratio:6.2f}{'' if c.within else '*'} "
              f"{top5:6} {r.grid_str} ({r.microbatches} mb){note}")
    bad = [c for c in checks if not c.within]
    print(f"Throughput points: TFLOP/s per GPU, bf16, sequence 2048, vocabulary 51200, batch = 1 sequence per GPU, "
          f"recompute and all overlaps on, published configurations not held, so 'predicted' is the best-ranked "
          f"configuration of the published layout (top 5: n/a). Time points (s/iteration): priced at the published "
          f"configuration. Ratio = published/predicted time (> 1: optimistic). Machine files as shipped. "
          f"* = outside ±{TOLERANCE:.0%}: {len(bad)} of {len(checks)}.")
    for name in dict.fromkeys(c.point.machine for c in checks):
        print(f"{name}: {load_machine(name).elementwise_note()}")
    if a.write_residuals:
        from .published import write_all_residuals
        for f in write_all_residuals(checks):
            print(f"wrote {f}")
    return 0


def cmd_validate_public(a: argparse.Namespace) -> int:
    from .suites import run_suites, summary_line, write_scatter

    names = tuple(a.suite) if a.suite else None
    results = run_suites(names, a.vtrain) if names else run_suites(vtrain_path=a.vtrain)
    for res in results:
        print(summary_line(res))
    if a.out_dir:
        for res in results:
            path = f"{a.out_dir}/{res.name}.png"
            _output("the scatter plot", path, lambda f, r=res: write_scatter(r, f) or print(
                f"matplotlib is not installed: no {f}"))
            print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m axgrid.perfmodel", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rank", help="rank every grid configuration")
    add_problem_args(r)
    r.add_argument("--top", type=int, default=10, help="rows to print (and to write sbatch scripts for)")
    r.add_argument("--layouts", choices=("4d", "tpppdp", "all"), default="all",
                   help="4d: the grids axgrid runs; tpppdp: Megatron-style TP×PP×DP (priced for comparison); all "
                        "(default): both in one ranking")
    r.add_argument("--csv")
    r.add_argument("--json")
    r.add_argument("--explain", type=int, metavar="N", help="print the breakdown of row N of the ranking")
    r.add_argument("--grid", metavar="GXxGYxGZxGD", help="price this one 4D grid and print its breakdown")
    r.add_argument("--ep", type=int, help="with --grid: the expert-parallel size of a mixture of experts (divides Gd "
                   "and the experts; default 1)")
    r.add_argument("--tp", type=int, help="price one Megatron-style configuration: tensor parallel degree")
    r.add_argument("--pp", type=int, help="... pipeline stages")
    r.add_argument("--dp", type=int, help="... data parallel degree (default: GPUs / (TP·PP))")
    r.add_argument("--vpp", type=int, help="... interleaved model chunks per stage (default 1)")
    r.add_argument("--sp", action="store_true", help="... with sequence parallelism")
    r.add_argument("--mbs", type=int, help="... micro-batch size in sequences (default: the fastest of 1/2/4/8)")
    r.add_argument("--recompute-mode", choices=["full", "selective", "none"],
                   help="... activation recompute (default: full, or none with --no-recompute); selective: the core "
                        "attention only (Korthikanti et al. 2022)")
    r.add_argument("--emit-slurm", metavar="DIR",
                   help="write an sbatch script for each 4D row of the printed table (rowNN_GRID.sbatch, NN its row), "
                        "built on the site template of experiments/slurm/ for the machine")
    r.add_argument("--show-infeasible", type=int, default=0, metavar="K", help="also list K rejected grids")
    r.add_argument("--verify", type=int, metavar="K",
                   help="dry-run the top K 4D rows (python -m axgrid.dryrun, one process each) and mark those whose "
                        "measured peak does not fit the machine or whose collectives' bytes differ from the prediction")
    r.set_defaults(fn=cmd_rank, zero="auto")
    m = sub.add_parser("machines", help="list the machine library")
    m.set_defaults(fn=cmd_machines)
    c = sub.add_parser("calibrate", help="fit α, β and the GEMM curve to samples measured by "
                                         "python -m axgrid.measure collectives")
    c.add_argument("--samples", help="samples JSON, written by `axgrid launch -n 4 -- python "
                                     "python -m axgrid.measure collectives --out FILE.json`")
    c.add_argument("--out", default="runs/local.toml")
    c.add_argument("--name", default="local")
    c.add_argument("--nranks", "--ranks", dest="ranks", type=int,
                   help="ranks per 'node' of the fitted machine (default: the ranks the samples were measured on)")
    c.add_argument("--base", help="machine to start from (default: this host, one node of --ranks ranks)")
    c.add_argument("--peak", type=float, help="peak FLOP/s to express GEMM efficiency against")
    c.set_defaults(fn=cmd_calibrate)
    v = sub.add_parser("validate", help="compare predicted step times with those measured by "
                                        "python -m axgrid.measure steps")
    add_problem_args(v)
    v.add_argument("--measured", help="step times: JSON written by `axgrid launch -n GPUS -- python "
                                      "python -m axgrid.measure steps PROBLEM-ARGS --out FILE.json` (the same "
                                      "problem arguments), or a CSV grid,seconds")
    v.add_argument("--out-dir", default="runs/validate")
    v.add_argument("--write-residuals", action="store_true",
                   help="store the measured/predicted residuals as the machine's error band (NAME.residuals.json "
                        "next to its TOML), replacing this problem's earlier ones")
    v.set_defaults(fn=cmd_validate)
    cp = sub.add_parser("check-published", help="predicted vs published throughput for every published point held")
    cp.add_argument("--write-residuals", action="store_true",
                    help="store each machine's residuals (its error band) as axgrid/perfmodel/machines/NAME.residuals.json")
    cp.set_defaults(fn=cmd_check_published)
    vp = sub.add_parser("validate-public", help="MAPE, per-group Spearman and top-1 regret on public measurements: "
                                                "vTrain's 1,440 A100 runs, the Korthikanti eight, check-published's 15, "
                                                "vTrain's 109 multi-node runs (held out), Frontier's public "
                                                "throughput figures (frontier-public)")
    vp.add_argument("--suite", action="append", choices=SUITES,
                    help="one suite (repeat for several; default: all)")
    vp.add_argument("--vtrain", metavar="CSV", help="vTrain's data/ground_truth_single.csv (default: the shipped copy)")
    vp.add_argument("--out-dir", metavar="DIR", help="write a predicted-vs-measured scatter PNG per suite there")
    vp.set_defaults(fn=cmd_validate_public)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)     # the command, for what it writes (sbatch headers)
    try:
        return a.fn(a)
    except PerfModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
