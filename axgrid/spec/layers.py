"""The FC layers of a GPT, in forward order: what each one multiplies and which grid dimensions split it.

A block is ``ln1, qkv, proj, ln2, up, down`` (:data:`BLOCK_MODULES`, the runtime's module names, in
``model.parameters()`` order); the model is ``layers`` blocks between the embeddings and ``ln_f, head``.
An FC layer computes ``Y = X Wᵀ`` with ``W [n, k]`` (n = out_features, k = in_features). A normal layer splits
k over x and n over y; a transposed one swaps them, so a normal layer's output layout is a transposed layer's
input layout. The forward all-reduces over the dimension splitting k (``in_dim``), the input-gradient over the
one splitting n (``out_dim``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

#: The parameterised modules of one block in ``model.parameters()`` (and forward) order.
BLOCK_MODULES = ("ln1", "qkv", "proj", "ln2", "up", "down")


class FCLayer(NamedTuple):
    """An FC layer ``W [n, k]``; ``transposed`` swaps the roles of x and y. ``name`` is the runtime's module name;
    ``recompute``: part of a block whose forward is recomputed in backward (the LM head is not)."""

    n: int
    k: int
    transposed: bool = False
    bias: bool = True
    name: str = ""
    recompute: bool = True

    @property
    def in_dim(self) -> str:
        """The grid dimension splitting ``k`` (the forward output is all-reduced over it)."""
        return "y" if self.transposed else "x"

    @property
    def out_dim(self) -> str:
        """The grid dimension splitting ``n`` (the input gradient is all-reduced over it)."""
        return "x" if self.transposed else "y"


def block_layers(hidden: int, *, ffn: Optional[int] = None, bias: bool = True) -> list[FCLayer]:
    """A block's FC layers: QKV ``[3h, h]`` normal (rows head by head, so y splits whole heads), attention-out
    ``[h, h]`` transposed, MLP-up ``[f, h]`` normal, MLP-down ``[h, f]`` transposed; ``f`` defaults to ``4h``."""
    h, f = hidden, ffn or 4 * hidden
    return [FCLayer(3 * h, h, False, bias, "qkv"), FCLayer(h, h, True, bias, "proj"),
            FCLayer(f, h, False, bias, "up"), FCLayer(h, f, True, bias, "down")]


def head_layer(hidden: int, vocab: int) -> FCLayer:
    """The LM head ``[V, h]``: a normal layer without bias (the vocabulary split over y), never recomputed."""
    return FCLayer(vocab, hidden, False, False, "head", recompute=False)


def model_layers(layers: int, hidden: int, vocab: int, bias: bool = True, head: bool = True) -> list[FCLayer]:
    """Every FC layer of the model in forward order: ``layers`` × :func:`block_layers`, then the head."""
    out = block_layers(hidden, bias=bias) * layers
    return out + [head_layer(hidden, vocab)] if head else out
