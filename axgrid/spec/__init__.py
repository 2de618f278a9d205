"""What the algorithm knows, in one torch-free place: imported by the runtime, the GEMM tuner and perfmodel alike.

=====================  =======================================================================================
grid shape, layout     :class:`GridShape`, :class:`RankLayout`, :class:`Coord` (:mod:`.layout`)
a transformer's shape  :class:`TransformerShape` (named size, Hugging Face config, vTrain row; parameters, layers),
                       :func:`hf_head_dim`, :data:`DECODER_FAMILIES` (:mod:`.shape`)
named model sizes      :data:`NAMED_SIZES` (GPT sizes), :data:`PUBLIC_MODELS` (public models' shapes) (:mod:`.sizes`)
the layer list         :class:`FCLayer`, :data:`BLOCK_MODULES`, :func:`block_layers`, :func:`head_layer`,
                       :func:`block_modules` (:mod:`.layers`)
per-rank sharding      :func:`fc_volumes`, :class:`LinearSharding` (:mod:`.fc`)
which part a rank holds :class:`TileSpec`, :func:`split_part`, :class:`Box`, :func:`part_boxes`, :func:`part_shape`,
                       :func:`flat_boxes`, :func:`tile_box`, :func:`overlap`, :func:`map_rows`,
                       :func:`segment_row_map`, :func:`row_segments` (:mod:`.tiles`)
FLOPs, parameters      :func:`gpt_flops_per_iteration`, :func:`gpt_parameters`, :func:`llama_flops` (:mod:`.flops`)
overlap schedule       :class:`OverlapConfig` (the switches; ``--overlap``), :data:`GRADIENT_WINDOW`,
                       :data:`DEFAULT_BUCKET_BYTES` (:mod:`.schedule`)
data-parallel buckets  :class:`Bucket`, :func:`pack_buckets`: the layout, a d-rank's share (:mod:`.buckets`)
=====================  =======================================================================================

Pure Python: no torch, no numpy (the volume functions take ints or integer arrays alike).
"""
from .layout import Coord, GridError, GridShape, RankLayout
from .fc import FCVolumes, LinearSharding, fc_volumes
from .flops import gpt_flops_per_iteration, gpt_parameters, llama_flops
from .layers import BLOCK_MODULES, FCLayer, block_layers, block_modules, head_layer
from .buckets import Bucket, pack_buckets
from .schedule import DEFAULT_BUCKET_BYTES, GRADIENT_WINDOW, OverlapConfig
from .shape import CONFIG_SEQ, DECODER_FAMILIES, GPT2_PADDED_VOCAB, TransformerShape, hf_head_dim, is_config_path
from .sizes import NAMED_SIZES, PUBLIC_MODELS
from .tiles import (Box, TileSpec, ceil_div, flat_boxes, map_rows, overlap, part_boxes, part_shape, row_segments,
                    segment_row_map, split_part, tile_box)

__all__ = ["Coord", "GridError", "GridShape", "RankLayout", "FCVolumes", "LinearSharding", "fc_volumes",
           "gpt_flops_per_iteration", "gpt_parameters", "llama_flops", "BLOCK_MODULES", "FCLayer", "block_layers",
           "block_modules", "head_layer", "DEFAULT_BUCKET_BYTES", "GRADIENT_WINDOW", "OverlapConfig", "GPT2_PADDED_VOCAB",
           "NAMED_SIZES", "PUBLIC_MODELS", "CONFIG_SEQ", "is_config_path", "TransformerShape", "hf_head_dim", "DECODER_FAMILIES", "Box", "TileSpec", "ceil_div", "flat_boxes", "overlap", "part_boxes",
           "part_shape", "split_part", "tile_box", "map_rows", "segment_row_map", "row_segments", "Bucket",
           "pack_buckets"]
