"""axgrid.perfmodel: analytical performance model of 4D (Gx×Gy×Gz×Gd) hybrid tensor-parallel transformer training,
with Megatron-style TP×PP×DP priced by the same code for comparison.

Pure Python + numpy/scipy (no torch, none of the axgrid runtime: ``import axgrid`` alone loads nothing; of axgrid
only the torch-free leaf ``axgrid.spec``: the model's shape ``TransformerShape``, the named sizes, the layer list,
per-rank volumes, FLOPs). Public surface:

    Options, Problem, get_model, model_flops                                inputs (the model: a TransformerShape)
    Machine, load_machine, list_machines                                    machine library
    enumerate_grids, Grids                                                  search space
    FCLayer, transformer_layers, collective_bytes, collective_calls,
    collective_events, ring_time                                            collectives (ledger-exact volumes;
                                                                            a TransformerShape: the whole GPT step)
    evaluate, rank, Ranking, Row, price_grid                                the model and the ranking
    TPPPDP, price_tp_pp_dp (pipeline.price), price_named                    Megatron-style TP×PP×DP
    perfmodel.published.check_all                                           predicted vs published points
    perfmodel.band.band_for                                                 the model's error band on a machine
"""
from .comm import FCLayer, collective_bytes, collective_calls, collective_events, ring_time
from .errors import MachineFileError, NoFeasibleConfig, PerfModelError
from .machines import Machine, list_machines, load_machine
from .model import Evaluation, evaluate
from .pipeline import TPPPDP, price_named
from .pipeline import price as price_tp_pp_dp
from .rank import Ranking, Row, price_grid, rank
from .space import Grids, enumerate_grids
from .problem import Options, Problem, get_model, model_flops, transformer_layers

__all__ = [
    "FCLayer", "collective_bytes", "collective_calls", "collective_events", "ring_time",
    "MachineFileError", "NoFeasibleConfig", "PerfModelError", "transformer_layers",
    "Machine", "list_machines", "load_machine", "Evaluation", "evaluate", "Ranking", "Row", "rank",
    "price_grid", "TPPPDP", "price_tp_pp_dp", "price_named",
    "Grids", "enumerate_grids", "Options", "Problem", "get_model", "model_flops",
]
