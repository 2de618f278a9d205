"""Machine descriptions: TOML files under axgrid/perfmodel/machines/ (or any path), read with tomllib.

Schema (units: FLOP/s, bytes, bytes/s, seconds). Required top-level keys are in ``REQUIRED``.

Optional measured tables (each with a ``# source:`` comment line in the shipped files):

    bandwidth_table = [{placement = "intra"|"inter", stride = <int>, group = <int>, beta = <bytes/s>}, ...]
        measured ring bandwidth per GPU (bus bandwidth, every group of that dimension running at once) of a group
        of ``group`` or more members spaced ``stride`` or more ranks apart, in that placement class. A ring uses
        the row of its class with the largest stride ≤ its stride, then the largest group ≤ its size; a ring no
        row covers falls back to the α-β link-sharing rule (``comm.ring_alpha_beta``).
    [[collective_table]]
    collective = "all_gather"|"reduce_scatter"|"all_reduce", group = <GPUs>, source = "<where measured>",
    bytes = [<buffer bytes>, ...], bus_bandwidth = [<bytes/s>, ...]
        measured bus bandwidth (nccl-tests' busbw: time = (p−1)/p · bytes / busbw, ×2 for an all-reduce) of one
        collective over ``group`` consecutive GPUs by buffer size in the ledger's convention (the all-gather's
        output, the reduce-scatter's input, the all-reduced tensor), sizes ascending. ``comm.measured_time``
        interpolates log-log in size and group size; a ring whose group is smaller than every table's, or an
        operation without a table (an all-reduce needs its own, or both an all-gather's and a reduce-scatter's),
        falls back to α-β.
    gemm_efficiency = {bf16 = {eff_max = <0..1>, dim_half = <elements>}, fp32 = {...}}
        per-dtype GEMM efficiency curve eff = eff_max · d / (d + dim_half), d = the smallest GEMM dimension.
    sm_count = <int>, gemm_tiles = [[<rows>, <columns>], ...], l2_bandwidth = <bytes/s>
        the GPU's streaming multiprocessors (compute units), the output tiles its GEMM library has kernels for (one
        tile per unit at a time) and the L2 cache's read bandwidth: a GEMM runs with the tile that gives it the
        most useful work per unit-time, its last wave's idle units and each tile's operand streaming from L2
        counted (``compute.wave_efficiency``); without ``sm_count``, no quantisation; without ``l2_bandwidth``,
        every tile at full rate.
    kernel_latency = <s>
        the time each kernel of a step adds beyond its work (launch and synchronisation), times the kernels a
        block runs (``compute.BLOCK_KERNELS_*``), a floor under the GPU's time per micro-batch; without it, none.
    host_device_exponent = <k>
        how the host's time and the GPU's combine (``model.host_bound``): (gpu^k + host^k)^(1/k); absent, the larger.
    gemm_table = "file.json"
        measured GEMM rates, a JSON list of {m, n, k, dtype, flops_per_s} (a path relative to the TOML), e.g. a
        vendor's or a cost model's published per-shape table; a GEMM of that dtype runs at its nearest measured
        shape (``compute._table_rate``) instead of the efficiency curve. ``[fitted] gemm_table`` (below) is the
        same, written by calibration.
    hbm_bandwidth = <bytes/s>
        one GPU's (GCD's) memory bandwidth, a measured achievable figure where one is held (dgx-a100), else its
        spec sheet's: prices the element-wise kernels (``compute.elementwise_bytes``), the optimizer step and the
        cross entropy; without it they are not priced, and ``rank`` says so.

Optional ``[fitted]`` table, written by calibration:

    [fitted.placement.intra]   alpha = <s>, beta = <bytes/s>      # a ring inside one node
    [fitted.placement.inter]   alpha = <s>, beta = <bytes/s>      # a ring across nodes, one ring per node
    [fitted.gemm_curve]        eff_max = <0..1>, dim_half = <elements>
    gemm_table = "file.json"   # or an inline array of {m, n, k, dtype, flops_per_s}; a path is relative to the TOML
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import MachineFileError

MACHINE_DIR = Path(__file__).resolve().parent / "machines"

REQUIRED: dict[str, type] = {
    "name": str,
    "gpus_per_node": int,
    "peak_flops_bf16": float,
    "peak_flops_fp32": float,
    "memory_bytes": int,
    "intra_node_bandwidth": float,
    "intra_node_latency": float,
    "inter_node_bandwidth_per_nic": float,
    "inter_node_latency": float,
    "nics_per_node": int,
}
PLACEMENT_CLASSES = ("intra", "inter")


@dataclass(frozen=True)
class Placement:
    """α (seconds per ring step) and β (bytes/s a ring moves) of one placement class."""

    alpha: float
    beta: float


@dataclass(frozen=True)
class BandwidthRow:
    """One measured ring bandwidth: groups of ≥ ``group`` members, ≥ ``stride`` ranks apart, in ``placement``."""

    placement: str
    stride: int
    group: int
    beta: float


#: the collectives a ``collective_table`` may measure
TABLE_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class CollectiveTable:
    """Measured bus bandwidth (bytes/s) of ``collective`` over ``group`` consecutive GPUs, by buffer ``nbytes``
    (ledger convention, ascending); ``source`` names the measurement."""

    collective: str
    group: int
    nbytes: tuple[float, ...]
    bus_bandwidth: tuple[float, ...]
    source: str = ""


@dataclass(frozen=True)
class GemmCurve:
    """GEMM efficiency eff_max · d / (d + dim_half) of the smallest dimension d, for one dtype."""

    eff_max: float
    dim_half: float


@dataclass(frozen=True)
class GemmRecord:
    """One measured GEMM: C[m,n] = A[m,k]·B[k,n] in ``dtype`` ran at ``flops_per_s`` (2·m·n·k / seconds)."""

    m: int
    n: int
    k: int
    dtype: str
    flops_per_s: float


#: ``Machine.gpu`` of a calibrated profile whose devices are gloo ranks on CPU cores (``perfmodel calibrate``).
CPU_RANK = "cpu rank"


@dataclass(frozen=True)
class Machine:
    """A machine. Bandwidths are per direction; intra_node_bandwidth is what one GPU can push into a ring
    inside its node; inter-node bandwidth is per NIC, ``nics_per_node`` NICs per node."""

    name: str
    gpus_per_node: int
    peak_flops_bf16: float
    peak_flops_fp32: float
    memory_bytes: int
    intra_node_bandwidth: float
    intra_node_latency: float
    inter_node_bandwidth_per_nic: float
    inter_node_latency: float
    nics_per_node: int
    description: str = ""
    gpu: str = ""
    placement: dict[str, Placement] = field(default_factory=dict)
    gemm_eff_max: float = 0.75
    gemm_dim_half: float = 96.0
    gemm_table: tuple[GemmRecord, ...] = ()
    source: str = ""
    bandwidth_table: tuple[BandwidthRow, ...] = ()
    gemm_curves: dict[str, GemmCurve] = field(default_factory=dict)
    hbm_bandwidth: float = 0.0          # bytes/s per GPU; 0 = not known: element-wise kernels not priced
    collective_tables: tuple[CollectiveTable, ...] = ()
    sm_count: int = 0                    # streaming multiprocessors (compute units); 0: no wave quantisation
    gemm_tiles: tuple[tuple[int, int], ...] = ((128, 128),)
    l2_bandwidth: float = 0.0            # bytes/s of the L2 cache's reads; 0: tiles not limited by it
    kernel_latency: float = 0.0          # seconds each kernel adds beyond its work; 0: not priced
    host_device_exponent: float = 0.0    # the smooth maximum of host and GPU time (``model.host_bound``); 0: max

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s per GPU for a dtype (fp16 uses the bf16 figure: same tensor-core rate)."""
        return self.peak_flops_fp32 if dtype == "fp32" else self.peak_flops_bf16

    def gemm_curve(self, dtype: str) -> GemmCurve:
        """The efficiency curve of a dtype: the machine file's ``gemm_efficiency`` (fp16 falls back to bf16),
        else the fitted/default curve."""
        for key in (dtype, "bf16" if dtype == "fp16" else None):
            if key in self.gemm_curves:
                return self.gemm_curves[key]
        return GemmCurve(self.gemm_eff_max, self.gemm_dim_half)

    def elementwise_note(self) -> str:
        """How the element-wise kernels are priced on this machine (one line for the output)."""
        if self.hbm_bandwidth > 0:
            return f"element-wise kernels priced at HBM {self.hbm_bandwidth / 1e9:g} GB/s"
        return f"element-wise kernels not priced: {self.name} has no hbm_bandwidth in its machine file"

    def placement_of(self, cls: str) -> Placement:
        """α, β of a placement class: fitted values if calibrated, else from the spec sheet."""
        if cls in self.placement:
            return self.placement[cls]
        if cls == "intra":
            return Placement(self.intra_node_latency, self.intra_node_bandwidth)
        return Placement(self.inter_node_latency, self.inter_node_bandwidth_per_nic * self.nics_per_node)

    def scaled(self, flops: float = 1.0, bandwidth: float = 1.0, memory: float = 1.0) -> "Machine":
        """A copy with FLOP/s, all bandwidths, or memory multiplied (for what-if studies and tests)."""
        return replace(
            self,
            peak_flops_bf16=self.peak_flops_bf16 * flops,
            peak_flops_fp32=self.peak_flops_fp32 * flops,
            intra_node_bandwidth=self.intra_node_bandwidth * bandwidth,
            inter_node_bandwidth_per_nic=self.inter_node_bandwidth_per_nic * bandwidth,
            placement={k: Placement(p.alpha, p.beta * bandwidth) for k, p in self.placement.items()},
            gemm_table=tuple(replace(g, flops_per_s=g.flops_per_s * flops) for g in self.gemm_table),
            bandwidth_table=tuple(replace(r, beta=r.beta * bandwidth) for r in self.bandwidth_table),
            collective_tables=tuple(replace(t, bus_bandwidth=tuple(b * bandwidth for b in t.bus_bandwidth))
                                    for t in self.collective_tables),
            memory_bytes=int(self.memory_bytes * memory),
        )


def _check(where: str, key: str, value: Any, typ: type) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise MachineFileError(f"{where}: field {key!r} must be {typ.__name__}, got {value!r}")
    if typ in (int, float) and value <= 0:
        raise MachineFileError(f"{where}: field {key!r} must be > 0, got {value!r}")
    return value


def load_gemm_table(path: str | Path) -> tuple[GemmRecord, ...]:
    """Read a JSON list of {m, n, k, dtype, flops_per_s} (``python -m axgrid.kernels export-efficiency FILE``)."""
    p = Path(path)
    try:
        rows = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MachineFileError(f"{p}: cannot read GEMM efficiency table: {e}") from None
    return _gemm_rows(str(p), rows)


def _gemm_rows(where: str, rows: Any) -> tuple[GemmRecord, ...]:
    if not isinstance(rows, list):
        raise MachineFileError(f"{where}: GEMM table must be a list of {{m, n, k, dtype, flops_per_s}}")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise MachineFileError(f"{where}: GEMM table entry {i} is not a table/object")
        w = f"{where}: GEMM table entry {i}"
        for key in ("m", "n", "k", "dtype", "flops_per_s"):
            if key not in r:
                raise MachineFileError(f"{w}: missing field {key!r}")
        out.append(GemmRecord(_check(w, "m", r["m"], int), _check(w, "n", r["n"], int), _check(w, "k", r["k"], int),
                              _check(w, "dtype", r["dtype"], str), _check(w, "flops_per_s", r["flops_per_s"], float)))
    return tuple(out)


def _bandwidth_rows(where: str, rows: Any) -> tuple[BandwidthRow, ...]:
    if not isinstance(rows, list):
        raise MachineFileError(f"{where}: field 'bandwidth_table' must be a list of "
                               "{placement, stride, group, beta}")
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: field 'bandwidth_table' entry {i}"
        if not isinstance(r, dict):
            raise MachineFileError(f"{w} is not a table")
        for key in ("placement", "stride", "group", "beta"):
            if key not in r:
                raise MachineFileError(f"{w}: missing field {key!r}")
        if r["placement"] not in PLACEMENT_CLASSES:
            raise MachineFileError(f"{w}: placement must be one of {PLACEMENT_CLASSES}, got {r['placement']!r}")
        out.append(BandwidthRow(r["placement"], _check(w, "stride", r["stride"], int),
                                _check(w, "group", r["group"], int), _check(w, "beta", r["beta"], float)))
    return tuple(out)


def _collective_tables(where: str, rows: Any) -> tuple[CollectiveTable, ...]:
    if not isinstance(rows, list):
        raise MachineFileError(f"{where}: 'collective_table' must be an array of tables ([[collective_table]])")
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: collective_table {i}"
        if not isinstance(r, dict):
            raise MachineFileError(f"{w} is not a table")
        for key in ("collective", "group", "bytes", "bus_bandwidth", "source"):
            if key not in r:
                raise MachineFileError(f"{w}: missing field {key!r}")
        if r["collective"] not in TABLE_COLLECTIVES:
            raise MachineFileError(f"{w}: collective must be one of {', '.join(TABLE_COLLECTIVES)}, got "
                                   f"{r['collective']!r}")
        sizes, bw = r["bytes"], r["bus_bandwidth"]
        if not (isinstance(sizes, list) and isinstance(bw, list) and len(sizes) == len(bw) >= 1):
            raise MachineFileError(f"{w}: bytes and bus_bandwidth must be arrays of the same length (>= 1)")
        sizes = [_check(w, "bytes", v, float) for v in sizes]
        bw = [_check(w, "bus_bandwidth", v, float) for v in bw]
        if any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise MachineFileError(f"{w}: bytes must be strictly ascending")
        out.append(CollectiveTable(r["collective"], _check(w, "group", r["group"], int), tuple(sizes), tuple(bw),
                                   _check(w, "source", r["source"], str)))
    return tuple(out)


def _gemm_curves(where: str, tab: Any) -> dict[str, GemmCurve]:
    if not isinstance(tab, dict):
        raise MachineFileError(f"{where}: field 'gemm_efficiency' must be a table of dtype = {{eff_max, dim_half}}")
    out = {}
    for dtype, c in tab.items():
        w = f"gemm_efficiency.{dtype}"
        if not isinstance(c, dict) or "eff_max" not in c or "dim_half" not in c:
            raise MachineFileError(f"{where}: field {w!r} needs eff_max and dim_half")
        e = _check(where, f"{w}.eff_max", c["eff_max"], float)
        if e > 1:
            raise MachineFileError(f"{where}: field '{w}.eff_max' must be <= 1, got {e}")
        out[dtype] = GemmCurve(e, _check(where, f"{w}.dim_half", c["dim_half"], float))
    return out


def parse_machine(data: dict[str, Any], where: str) -> Machine:
    """Validate a parsed TOML table; ``where`` (the file name) prefixes every error."""
    kw: dict[str, Any] = {}
    for key, typ in REQUIRED.items():
        if key not in data:
            raise MachineFileError(f"{where}: missing required field {key!r}")
        kw[key] = _check(where, key, data[key], typ)
    for key in ("description", "gpu"):
        if key in data:
            kw[key] = _check(where, key, data[key], str)
    if "hbm_bandwidth" in data:
        kw["hbm_bandwidth"] = _check(where, "hbm_bandwidth", data["hbm_bandwidth"], float)
    if "sm_count" in data:
        kw["sm_count"] = _check(where, "sm_count", data["sm_count"], int)
    if "gemm_tiles" in data:
        tiles = data["gemm_tiles"]
        if not (isinstance(tiles, list) and tiles and all(isinstance(t, list) and len(t) == 2 for t in tiles)):
            raise MachineFileError(f"{where}: field 'gemm_tiles' must be a list of [rows, columns], got {tiles!r}")
        kw["gemm_tiles"] = tuple(tuple(_check(where, "gemm_tiles", v, int) for v in t) for t in tiles)
    if "l2_bandwidth" in data:
        kw["l2_bandwidth"] = _check(where, "l2_bandwidth", data["l2_bandwidth"], float)
    if "kernel_latency" in data:
        kw["kernel_latency"] = _check(where, "kernel_latency", data["kernel_latency"], float)
    if "host_device_exponent" in data:
        kw["host_device_exponent"] = _check(where, "host_device_exponent", data["host_device_exponent"], float)
    if "bandwidth_table" in data:
        kw["bandwidth_table"] = _bandwidth_rows(where, data["bandwidth_table"])
    if "gemm_efficiency" in data:
        kw["gemm_curves"] = _gemm_curves(where, data["gemm_efficiency"])
    if "collective_table" in data:
        kw["collective_tables"] = _collective_tables(where, data["collective_table"])
    fitted = data.get("fitted", {})
    if not isinstance(fitted, dict):
        raise MachineFileError(f"{where}: field 'fitted' must be a table")
    placement = {}
    for cls, tab in fitted.get("placement", {}).items():
        if cls not in PLACEMENT_CLASSES:
            raise MachineFileError(f"{where}: field 'fitted.placement.{cls}': unknown class (known: intra, inter)")
        for key in ("alpha", "beta"):
            if key not in tab:
                raise MachineFileError(f"{where}: missing field 'fitted.placement.{cls}.{key}'")
        placement[cls] = Placement(_check(where, f"fitted.placement.{cls}.alpha", tab["alpha"], float),
                                   _check(where, f"fitted.placement.{cls}.beta", tab["beta"], float))
    kw["placement"] = placement
    curve = fitted.get("gemm_curve", {})
    if curve:
        for key in ("eff_max", "dim_half"):
            if key not in curve:
                raise MachineFileError(f"{where}: missing field 'fitted.gemm_curve.{key}'")
        kw["gemm_eff_max"] = _check(where, "fitted.gemm_curve.eff_max", curve["eff_max"], float)
        kw["gemm_dim_half"] = _check(where, "fitted.gemm_curve.dim_half", curve["dim_half"], float)
        if kw["gemm_eff_max"] > 1:
            raise MachineFileError(f"{where}: field 'fitted.gemm_curve.eff_max' must be <= 1")
    if "gemm_table" in data and "gemm_table" in fitted:
        raise MachineFileError(f"{where}: give gemm_table at the top level (measured) or under [fitted], not both")
    table = data.get("gemm_table", fitted.get("gemm_table"))
    if isinstance(table, str):
        base = Path(where).parent if where else Path(".")
        kw["gemm_table"] = load_gemm_table(base / table)
    elif table is not None:
        kw["gemm_table"] = _gemm_rows(f"{where}: field 'fitted.gemm_table'", table)
    return Machine(source=where, **kw)


def known_machine_files(extra_dirs: tuple[Path, ...] = ()) -> dict[str, Path]:
    """Machine name → file, from the package's machines/ folder then ./machines/ (later ones override)."""
    out: dict[str, Path] = {}
    for d in (MACHINE_DIR, Path("machines"), *extra_dirs):
        if d.is_dir():
            for f in sorted(d.glob("*.toml")):
                out[f.stem] = f
    return out


def load_machine(name_or_path: str | Path) -> Machine:
    """Load a machine by name (axgrid/perfmodel/machines/NAME.toml or ./machines/NAME.toml) or by file path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise MachineFileError(f"{p}: machine file not found")
        path = p
    else:
        files = known_machine_files()
        if str(name_or_path) not in files:
            raise MachineFileError(f"unknown machine {str(name_or_path)!r}; known machines: {', '.join(files)}")
        path = files[str(name_or_path)]
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise MachineFileError(f"{path}: malformed TOML: {e}") from None
    return parse_machine(data, str(path))


def list_machines() -> list[Machine]:
    """All machines that load (a broken file raises, naming file and field)."""
    return [load_machine(p) for p in known_machine_files().values()]


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def machine_to_toml(m: Machine, comment: str = "") -> str:
    """Serialise a machine (with its fitted fields) to TOML that ``load_machine`` reads back."""
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    for key in REQUIRED:
        lines.append(f"{key} = {_fmt(getattr(m, key))}")
    lines += [f"description = {_fmt(m.description)}", f"gpu = {_fmt(m.gpu)}"]
    if m.hbm_bandwidth > 0:
        lines.append(f"hbm_bandwidth = {m.hbm_bandwidth!r}")
    if m.sm_count:
        tiles = ", ".join(f"[{a}, {b}]" for a, b in m.gemm_tiles)
        lines += [f"sm_count = {m.sm_count}", f"gemm_tiles = [{tiles}]"]
    if m.l2_bandwidth > 0:
        lines.append(f"l2_bandwidth = {m.l2_bandwidth!r}")
    if m.kernel_latency > 0:
        lines.append(f"kernel_latency = {m.kernel_latency!r}")
    if m.host_device_exponent > 0:
        lines.append(f"host_device_exponent = {m.host_device_exponent!r}")
    if m.bandwidth_table:
        rows = ", ".join(f'{{placement = "{r.placement}", stride = {r.stride}, group = {r.group}, beta = {r.beta!r}}}'
                         for r in m.bandwidth_table)
        lines.append(f"bandwidth_table = [{rows}]")
    if m.gemm_curves:
        curves = ", ".join(f"{d} = {{eff_max = {c.eff_max!r}, dim_half = {c.dim_half!r}}}"
                           for d, c in m.gemm_curves.items())
        lines.append(f"gemm_efficiency = {{{curves}}}")
    lines.append("")
    for t in m.collective_tables:
        lines += ["[[collective_table]]", f'collective = "{t.collective}"', f"group = {t.group}",
                  f"source = {_fmt(t.source)}", f"bytes = [{', '.join(repr(v) for v in t.nbytes)}]",
                  f"bus_bandwidth = [{', '.join(repr(v) for v in t.bus_bandwidth)}]", ""]
    for cls, pl in m.placement.items():
        lines += [f"[fitted.placement.{cls}]", f"alpha = {pl.alpha!r}", f"beta = {pl.beta!r}", ""]
    lines += ["[fitted.gemm_curve]", f"eff_max = {m.gemm_eff_max!r}", f"dim_half = {m.gemm_dim_half!r}", ""]
    if m.gemm_table:
        lines.append("[fitted]")
        rows = ", ".join(
            f'{{m = {g.m}, n = {g.n}, k = {g.k}, dtype = "{g.dtype}", flops_per_s = {g.flops_per_s!r}}}'
            for g in m.gemm_table)
        lines.append(f"gemm_table = [{rows}]")
    return "\n".join(lines) + "\n"
