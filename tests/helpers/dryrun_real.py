"""Shared by the dry-run agreement tests: one real gloo rank's step of a dry-run config, measured as the dry run
measures its fake rank (``axgrid.dryrun.step.measure_step``), for ``testing.ranks``."""


def measure_real_step(cfg):
    """Run ``cfg`` (an ``axgrid.dryrun.config`` of this world's size) on this gloo rank; its measured step."""
    import torch

    import axgrid
    from axgrid.dryrun.step import measure_step, runtime_config
    torch.set_num_threads(1)
    grid = axgrid.init(cfg.grid, config=runtime_config(cfg))
    try:
        return measure_step(cfg, grid, lambda dtype: torch.autocast("cpu", dtype=dtype))
    finally:
        grid.destroy()
