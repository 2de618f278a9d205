"""``axgrid.spec``, the torch-free leaf: what it says a GPT is (the layer list) is what the runtime builds."""
from __future__ import annotations

from axgrid.models.gpt import GPT, GPTConfig
from axgrid.spec import BLOCK_MODULES, block_layers, head_layer

# layers, hidden, heads, seq, vocab, ffn
SIZES = (2, 6, 2, 4, 10, 24)


def test_serial_block_is_the_layer_list():
    layers, hidden, heads, seq, vocab, ffn = SIZES
    for bias in (True, False):
        model = GPT(GPTConfig(layers, hidden, heads, seq, vocab, ffn=ffn, bias=bias), None)
        block = model.blocks[0]
        assert tuple(name for name, _ in block.named_children()) == BLOCK_MODULES
        for layer in block_layers(hidden, ffn, bias) + [head_layer(hidden, vocab)]:
            fc = model.head if layer.name == "head" else getattr(block, layer.name)
            assert (fc.out_features, fc.in_features, fc.bias is not None) == (layer.n, layer.k, layer.bias), layer
