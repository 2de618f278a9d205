"""``axgrid.spec``, the torch-free leaf: it imports without torch, and what it says a GPT is (the layer list, each
rank's parameter sizes) is what the runtime builds and what perfmodel prices."""
from __future__ import annotations

import subprocess
import sys

import torch

import axgrid
from axgrid.models.gpt import GPT, GPTConfig
from axgrid.spec import BLOCK_MODULES, TransformerShape, block_layers, fc_volumes, head_layer
from axgrid.perfmodel.parameters import trainable_parameters

# layers, hidden, heads, seq, vocab, ffn: on both grids below the QKV block (27 or 54 elements) and the head's
# are not multiples of Gz, so the shards are padded
SIZES = (2, 6, 2, 4, 10, 24)
GRIDS = ["2x2x2x1", "1x2x4x1"]


def test_leaf_imports_without_torch():
    code = ("import sys, axgrid.spec; bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy') "
            "or m.startswith('axgrid') and m not in ('axgrid', 'axgrid.spec.layout') and not m.startswith('axgrid.spec')]; "
            "assert not bad, bad[:5]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serial_block_is_the_layer_list():
    layers, hidden, heads, seq, vocab, ffn = SIZES
    for bias in (True, False):
        model = GPT(GPTConfig(TransformerShape("test", layers, hidden, heads, seq, vocab, bias=bias, ffn=ffn)), None)
        block = model.blocks[0]
        assert tuple(name for name, _ in block.named_children()) == BLOCK_MODULES
        for layer in block_layers(hidden, ffn=ffn, bias=bias) + [head_layer(hidden, vocab)]:
            fc = model.head if layer.name == "head" else getattr(block, layer.name)
            assert (fc.out_features, fc.in_features, fc.bias is not None) == (layer.n, layer.k, layer.bias), layer


def _perfmodel_key(name: str) -> str:
    """A runtime parameter name as perfmodel.parameters keys it: blocks.3.up.weight -> b3.up.w, wte.weight -> wte."""
    module, _, kind = name.rpartition(".")
    return module if module in ("wte", "wpe") else f"{module.replace('blocks.', 'b')}.{kind[0]}"


def rank_parameters(grids: list[str]) -> list[list[tuple]]:
    """On one rank, per grid: (key, elements) of every parameter in model.parameters() order, and per FC layer
    (name, transposed, weight elements, bias elements)."""
    layers, hidden, heads, seq, vocab, ffn = SIZES
    out = []
    for spec in grids:
        grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60))
        try:
            model = GPT(GPTConfig(TransformerShape("test", layers, hidden, heads, seq, vocab, ffn=ffn)), grid)
            params = [(_perfmodel_key(n), p.numel()) for n, p in model.named_parameters()]
            fcs = [(name, mod.transpose, mod.weight.numel(), mod.bias.numel() if mod.bias is not None else 0)
                   for name, mod in [(n, getattr(model.blocks[0], n)) for n in ("qkv", "proj", "up", "down")]
                   + [("head", model.head)]]
            out.append([params, fcs])
        finally:
            grid.destroy()
    return out


def test_runtime_parameters_are_the_spec_volumes(ranks):
    layers, hidden, heads, seq, vocab, ffn = SIZES
    per_rank = ranks(8, rank_parameters, GRIDS)
    spec = TransformerShape("test", layers, hidden, heads, seq=seq, vocab=vocab)
    for i, g in enumerate(GRIDS):
        shape = tuple(int(v) for v in g.split("x"))
        want_fc = []
        for layer in block_layers(hidden, ffn=ffn) + [head_layer(hidden, vocab)]:
            v = fc_volumes(layer, *shape[:3], 1)
            want_fc.append((layer.name, layer.transposed, v.shard, v.bias_loc))
        want_params = [(p.key, p.elems) for p in trainable_parameters(spec, shape)]
        for r, (params, fcs) in enumerate(x[i] for x in per_rank):
            assert fcs == want_fc, (g, r)
            assert params == want_params, (g, r)
