"""Tensors in and out of a parallel model: a rank's part copied out of and into dense tensors, a model's tensors as
parts and the agreement before any collective read or write, loading, exporting, and state dicts. Which part of a
dense tensor a rank holds is :mod:`axgrid.spec.tiles` (pure arithmetic); everything here moves tensors through it.

======================  ===================================================================================
moving a part           :func:`read_part` (from any box reader: safetensors slice, dense tensor, saved tile),
                        :func:`part_of_dense`, :func:`place_part`, :func:`tile_of` (:mod:`.part_copy`)
a model's tensors       :class:`TensorPart`, :func:`model_parts`, :func:`replicated_letters`,
                        :func:`fingerprint`, :func:`dtype_name`, :func:`agree`,
                        :func:`raise_on_any_rank` (one rank's error raised on every rank) (:mod:`.parts`)
state dicts             the hooks that keep ``state_dict``/``load_state_dict``/``deepcopy`` right for parts
                        (:mod:`.state_dict`)
loading a HF model      ``axgrid.from_pretrained``, ``LoadReport`` (:mod:`.pretrained`), on
                        :class:`~.hf_files.HFCheckpoint` (the safetensors folder, read box by box) and
                        :mod:`.meta` (parameters on meta while building, materialised in place)
dense tensors, export   ``axgrid.dense_state_dict``, ``axgrid.to_dense``, ``axgrid.export_pretrained``
                        (:mod:`.export`), streamed into :class:`~.safetensors_writer.SafetensorsWriter`
======================  ===================================================================================

(:mod:`.pretrained` and :mod:`.export` are not imported here: they build on :func:`axgrid.parallelize`, which builds
on this package.)
"""
from .parts import (TensorPart, agree, dtype_name, fingerprint, model_parts, raise_on_any_rank,
                    replicated_letters)
from .part_copy import copy_part_, part_of_dense, place_part, read_part, tile_of

__all__ = ["copy_part_", "part_of_dense", "place_part", "read_part", "tile_of", "TensorPart", "agree", "dtype_name",
           "fingerprint", "model_parts", "raise_on_any_rank", "replicated_letters"]
