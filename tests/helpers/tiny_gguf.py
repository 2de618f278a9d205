"""Tiny GGUF files written with the ``gguf`` package (llama.cpp's own writer), for axgrid.convert's bad-input tests:
a one-layer Llama-shaped file whose architecture name or tensor quantisation can be chosen."""
from __future__ import annotations


def write_gguf(path: str, arch: str = "llama", quant: str = "F32") -> str:
    """A one-layer model of ``arch`` (hidden 32, vocabulary 64) with its matrices stored as ``quant`` (a
    ``GGMLQuantizationType`` name; bytes of zeros for a quantised type)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
    qtype = GGMLQuantizationType[quant]
    hidden, ffn, vocab, heads = 32, 64, 64, 4
    w = GGUFWriter(path, arch)
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(97 + i % 26) * (1 + i // 26) for i in range(vocab)])
    w.add_token_types([1] * vocab)

    def matrix(name: str, rows: int, cols: int) -> None:
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, np.zeros((rows, cols), np.float32))
            return
        block, size = GGML_QUANT_SIZES[qtype]
        raw = np.zeros((rows, cols // block * size), np.uint8)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)

    matrix("token_embd.weight", vocab, hidden)
    for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", hidden // 2, hidden),
                             ("attn_v", hidden // 2, hidden), ("attn_output", hidden, hidden),
                             ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
        matrix(f"blk.0.{name}.weight", rows, cols)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
