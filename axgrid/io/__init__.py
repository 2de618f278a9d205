"""Tensors in and out of a parallel model: which part of each dense tensor a rank holds (:mod:`.tiles`), a
model's tensors as parts and the agreement before any collective read or write (:mod:`.parts`).

=====================  ====================================================================================
geometry               :class:`Box`, :func:`part_boxes`, :func:`part_shape`, :func:`flat_boxes`,
                       :func:`tile_box`, :func:`overlap`, :func:`tile_of` (:mod:`.tiles`)
moving a part          :func:`read_part` (from any box reader: safetensors slice, dense tensor, saved tile),
                       :func:`part_of_dense`, :func:`place_part` (:mod:`.tiles`)
a model's tensors      :class:`TensorPart`, :func:`model_parts`, :func:`replicated_letters`,
                       :func:`fingerprint`, :func:`dtype_name`, :func:`agree`,
                       :func:`raise_on_any_rank` (one rank's error raised on every rank) (:mod:`.parts`)
loading a HF model     ``axgrid.from_pretrained``, ``LoadReport`` (:mod:`.pretrained`), on
                       :class:`~.hf_files.HFCheckpoint` (the safetensors folder, read box by box) and
                       :mod:`.meta` (parameters on meta while building, materialised in place)
writing safetensors    :class:`~.safetensors_writer.SafetensorsWriter`: a file written tensor by tensor, or
                       slab of rows by slab (what ``axgrid.export_pretrained`` streams into)
=====================  ====================================================================================

(:mod:`.pretrained` is not imported here: it builds on :func:`axgrid.parallelize`, which builds on this package.)
"""
from .parts import (TensorPart, agree, dtype_name, fingerprint, model_parts, raise_on_any_rank,
                    replicated_letters)
from .tiles import (Box, flat_boxes, overlap, part_boxes, part_of_dense, part_shape, place_part, read_part, tile_box,
                    tile_of)

__all__ = ["Box", "flat_boxes", "overlap", "part_boxes", "part_of_dense", "part_shape", "place_part", "read_part",
           "tile_box", "tile_of", "TensorPart", "agree", "dtype_name", "fingerprint", "model_parts",
           "raise_on_any_rank", "replicated_letters"]
