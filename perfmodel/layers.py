"""The FC layers of a GPT block and its head, in forward order, as the runtime builds them."""
from __future__ import annotations

from .comm import FCLayer
from .spec import TransformerSpec


def block_layers(spec: TransformerSpec) -> list[FCLayer]:
    """QKV [3h×h] normal, attention-out [h×h] transposed, MLP-up [4h×h] normal, MLP-down [h×4h] transposed."""
    h, b = spec.hidden, spec.bias
    return [FCLayer(3 * h, h, False, b, "qkv"), FCLayer(h, h, True, b, "attn_out"),
            FCLayer(4 * h, h, False, b, "mlp_up"), FCLayer(h, 4 * h, True, b, "mlp_down")]


def head_layer(spec: TransformerSpec) -> FCLayer:
    """LM head [V×h], a normal layer without bias (vocab split over y, padded up to a multiple of Gy)."""
    return FCLayer(spec.vocab, spec.hidden, False, False, "lm_head", recompute=False)


def transformer_layers(spec: TransformerSpec, head: bool = True) -> list[FCLayer]:
    """All FC layers of the model in forward order: layers × block_layers, then the head (when ``head``)."""
    out = block_layers(spec) * spec.layers
    return out + [head_layer(spec)] if head else out
