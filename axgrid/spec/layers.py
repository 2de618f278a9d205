"""The FC layers of a GPT, in forward order: what each one multiplies and which grid dimensions split it.

A block is ``ln1, qkv, proj, ln2, up, down`` (:data:`BLOCK_MODULES`, the runtime's module names, in
``model.parameters()`` order); the model is ``layers`` blocks between the embeddings and ``ln_f, head``.
:func:`block_layers` is the one list of a block's FC layers: the runtime builds its FC modules from it, and
perfmodel prices a step as a loop over it (a block's layer norms are where the layers' ``norm`` put them), so a
layer added there (a gate, a fused projection) is priced, counted and replayed everywhere.
An FC layer computes ``Y = X Wᵀ`` with ``W [n, k]`` (n = out_features, k = in_features). A normal layer splits
k over x and n over y; a transposed one swaps them, so a normal layer's output layout is a transposed layer's
input layout. The forward all-reduces over the dimension splitting k (``in_dim``), the input-gradient over the
one splitting n (``out_dim``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Optional


class FCLayer(NamedTuple):
    """An FC layer ``W [n, k]``; ``transposed`` swaps the roles of x and y. ``name`` is the runtime's module name;
    ``recompute``: part of a block whose forward is recomputed in backward (the LM head is not); ``norm``: the
    layer norm right before this layer (its module comes first in ``model.parameters()`` order, and it normalises
    this layer's input; "" for none); ``attention``: the attention core (QKᵀ, softmax, ·V on the local heads) runs
    on this layer's output before the next layer; ``post_norm``: a layer norm right after this layer, normalising
    its output before the residual add (Gemma 3's ``post_attention_layernorm`` after ``o_proj`` and
    ``post_feedforward_layernorm`` after ``down_proj``; "" for none, as in the GPT and the Llama structure)."""

    n: int
    k: int
    transposed: bool = False
    bias: bool = True
    name: str = ""
    recompute: bool = True
    norm: str = ""
    attention: bool = False
    post_norm: str = ""

    @property
    def in_dim(self) -> str:
        """The grid dimension splitting ``k`` (the forward output is all-reduced over it)."""
        return "y" if self.transposed else "x"

    @property
    def out_dim(self) -> str:
        """The grid dimension splitting ``n`` (the input gradient is all-reduced over it)."""
        return "x" if self.transposed else "y"


def block_layers(hidden: int, *, ffn: Optional[int] = None, bias: bool = True) -> list[FCLayer]:
    """A block's FC layers: QKV ``[3h, h]`` normal (rows head by head, so y splits whole heads) after ``ln1``, with
    attention on its output; attention-out ``[h, h]`` transposed; MLP-up ``[f, h]`` normal after ``ln2``;
    MLP-down ``[h, f]`` transposed; ``f`` defaults to ``4h``."""
    h, f = hidden, ffn or 4 * hidden
    return [FCLayer(3 * h, h, False, bias, "qkv", norm="ln1", attention=True), FCLayer(h, h, True, bias, "proj"),
            FCLayer(f, h, False, bias, "up", norm="ln2"), FCLayer(h, f, True, bias, "down")]


def head_layer(hidden: int, vocab: int) -> FCLayer:
    """The LM head ``[V, h]`` after ``ln_f``: a normal layer without bias (the vocabulary split over y), never
    recomputed."""
    return FCLayer(vocab, hidden, False, False, "head", recompute=False, norm="ln_f")


def block_modules(layers: Sequence[FCLayer]) -> tuple[str, ...]:
    """The parameterised modules of a block of FC ``layers``, in forward order (the GPT's ``model.parameters()``
    order): each layer's ``norm`` (when it has one), the layer, its ``post_norm`` (when it has one)."""
    return tuple(name for layer in layers for name in (layer.norm, layer.name, layer.post_norm) if name)


#: The parameterised modules of one block in ``model.parameters()`` (and forward) order (names only: any size).
BLOCK_MODULES = block_modules(block_layers(1))
