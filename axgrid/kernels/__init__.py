"""axgrid.kernels: GEMM layout auto-tuner with a persistent cache.

Public surface:
    GemmTuner          callable ``tuner(a, b, role) -> a @ b`` with tuned layout/order per signature
    GemmSignature      (m, n, k, dtype, device, role) key of a decision
    GemmCache          the JSON decision file; GemmCacheWarning for unreadable/unwritable files
    Agreement, agree_on, torch_group_agreement   one rank decides, the group adopts it
    layer_gemm_shapes  per-rank (m, n, k, role) of a GPT model on a Gx x Gy x Gz x Gd grid (sizes, layers and
                       grid shape from axgrid.spec)
    ROLES
"""
from .agree import Agreement, agree_on, torch_group_agreement
from .cache import GemmCache, GemmCacheWarning, default_cache_path
from .shapes import layer_gemm_shapes, layer_gemms
from .signature import ROLE_INPUT_LAYOUTS, ROLES, GemmSignature
from .tuner import GemmTuner, TunerStats

__all__ = ["GemmTuner", "TunerStats", "GemmSignature", "GemmCache", "GemmCacheWarning", "default_cache_path",
           "Agreement", "agree_on", "torch_group_agreement", "layer_gemm_shapes", "layer_gemms",
           "ROLES", "ROLE_INPUT_LAYOUTS"]
