"""The shape of a transformer: the one description that the runtime's GPT (``axgrid.models.GPTConfig`` holds one),
the Hugging Face config reader, the dry run and perfmodel all read, so that a suite row, a dry run and a training
run price and build the same model.

=================================================  ==============================================================
constructor                                        the shape of
=================================================  ==============================================================
``TransformerShape.named("gpt-5b", **changes)``    a named GPT size (:data:`axgrid.spec.NAMED_SIZES`)
``TransformerShape.from_hf_config(config, seq)``   a Hugging Face config: a ``config.json``'s dict or a
                                                   ``PretrainedConfig`` (read by attribute)
``TransformerShape.from_config_json(path, seq)``   the ``config.json`` at ``path`` (or in the folder ``path``)
``TransformerShape.from_vtrain_row(row)``          one row of vTrain's ground truth (``hidden``, ``heads``,
                                                   ``layers``, ``seq``; Megatron-LM's GPT)
=================================================  ==============================================================

What follows from a shape is here too: the head size, the MLP width, the parameter count, the FLOPs of a step
(GPT), the block's FC layers and the LM head (``axgrid.spec.layers``), the grid rules (which sizes a grid
dimension must divide).

The block structures (``family``):

- ``"gpt"``: axgrid's GPT (``axgrid.models.gpt``): per block LayerNorm, fused QKV ``[3h, h]``, attention-out
  ``[h, h]``, LayerNorm, MLP-up ``[f, h]``, GELU, MLP-down ``[h, f]`` (a bias on each when ``bias``); a learned
  position table of ``seq`` rows; the final LayerNorm and an untied head ``[V, h]``.
- ``"llama"``, ``"mistral"``, ``"qwen2"`` (:data:`DECODER_FAMILIES`): Hugging Face's Llama structure: per layer
  RMSNorm, q ``[H·d, h]``, k and v ``[H_kv·d, h]``, o ``[h, H·d]``, RMSNorm, gate and up ``[f, h]``, SwiGLU, down
  ``[h, f]`` (biases as ``attention_bias``, ``output_bias``, ``mlp_bias`` say); rotary positions (no table); the
  final RMSNorm and the head, ``tied`` to the token table or not. ``bias`` is the GPT's and is False here.
  Mistral's ``sliding_window`` (when its config sets one) covers every layer.
- ``"qwen3"``: the Llama structure with ``head_norms`` (q_norm, k_norm: RMS norms over each head's ``d`` features,
  after q and k) and its own ``head_dim``; q, k, v and o carry biases with ``attention_bias``.
- ``"gemma3_text"`` (Gemma 3's text decoder; a multimodal ``"gemma3"`` config is read through its ``text_config``):
  head norms, four hidden-width RMSNorms per layer (``input_layernorm`` before q, k, v;
  ``post_attention_layernorm`` after o; ``pre_feedforward_layernorm`` before gate and up;
  ``post_feedforward_layernorm`` after down: the layers' ``norm`` and ``post_norm``), GeGLU (gelu_pytorch_tanh),
  ``head_dim`` from the config, tied embeddings by default; sliding-window layers as ``layer_types`` says (else
  ``sliding_window_pattern``: all but every 6th layer).
- ``"mixtral"``, ``"qwen2_moe"``, ``"qwen3_moe"``, ``"olmoe"`` (:data:`MOE_FAMILIES`): mixtures of experts on the
  attention of Mistral, Qwen2, Qwen3 and Llama (OLMoE: its q_norm and k_norm over the whole q and k widths,
  :meth:`TransformerShape.head_norm_widths`). Each MoE layer's MLP is a router ``[E, h]`` (no bias) choosing
  ``top_k`` of ``experts`` SwiGLU experts (gate and up ``[f_e, h]``, down ``[h, f_e]``, ``f_e`` = ``expert_ffn``),
  scoring by ``router_scoring`` and renormalising the chosen weights with ``norm_topk_prob``; Qwen2-MoE adds a
  shared expert of width ``shared_expert_ffn`` on every token, scaled by a sigmoid gate ``[1, h]``. Qwen2/3-MoE's
  ``decoder_sparse_step`` and ``mlp_only_layers`` leave some layers a dense MLP of width ``ffn``
  (``dense_layers``). :meth:`TransformerShape.block_layers` lists a MoE layer's dense FC layers (attention, shared
  expert); :meth:`TransformerShape.expert_layers` one routed expert's.
- ``"phi3"``: fused ``qkv_proj`` ``[(H + 2·H_kv)·d, h]`` and ``gate_up_proj`` ``[2f, h]`` (one FC layer each, as the
  plan splits them: each segment over y on its own, so a rank's block is as large as the unfused layers'), o and
  down as Llama's, no biases; ``sliding_window`` (when set) on every layer.

A config.json that leaves a field out gets transformers' default for its family (:data:`HF_DEFAULTS`): the
published Gemma 3 configs state neither ``head_dim`` nor ``vocab_size``.

Runtime knobs (recompute, dtype, dropout, initialisation, the norms' epsilon) are not shape: ``GPTConfig`` and
``perfmodel.Options`` hold them. Pure Python (no torch, no numpy); bad sizes raise a ValueError naming the value.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

from .flops import gpt_flops_per_iteration, gpt_parameters
from .layers import FCLayer, block_layers, block_modules, head_layer

#: GPT-2/NeoX's ~50,257 tokens padded to a multiple of 1024 (51200 = 2^11·5^2: divisible by every power-of-two
#: Gy up to 2048, and by 5, 10, 20, ...).
GPT2_PADDED_VOCAB = 51200

#: ``model_type`` of a config.json -> its causal-LM class: the Hugging Face decoder families that a shape describes
#: (``axgrid.plans.hf`` has a plan for each)
DECODER_FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}
#: ``model_type`` -> causal-LM class of the mixture-of-experts families (part of :data:`DECODER_FAMILIES`)
MOE_FAMILIES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}
DECODER_FAMILIES.update(MOE_FAMILIES)
#: a MoE family -> the dense family whose attention (biases, windows, head norms) it has
MOE_ATTENTION = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3", "olmoe": "llama"}
#: how a router scores the experts before its top-k (Mixtral, Qwen-MoE, OLMoE: softmax; DeepSeek-V3: sigmoid)
ROUTER_SCORINGS = ("softmax", "sigmoid")
#: the model_type of Gemma 3's multimodal config, whose ``text_config`` is a ``"gemma3_text"`` decoder's
GEMMA3_MULTIMODAL = "gemma3"
#: family -> transformers' defaults (``*Config`` class fields, transformers 5.x) for the config.json fields a shape
#: reads that a published config may leave out
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 4096},
    "qwen2": {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    "mixtral": {"sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28, "qkv_bias": True,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False},
    "qwen3_moe": {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
                  "num_experts": 128, "norm_topk_prob": False},
    "olmoe": {"num_experts_per_tok": 8, "num_experts": 64, "norm_topk_prob": False},
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096,
                    "sliding_window_pattern": 6, "tie_word_embeddings": True},
}
#: every block structure a shape can have
FAMILIES = ("gpt",) + tuple(DECODER_FAMILIES)


def _sliding(config: Any, family: str, layers: int) -> tuple[int, int]:
    """(window, layers that have it) of a Hugging Face ``config`` as transformers builds the ``family``'s masks:
    Mistral and Phi-3 every layer when ``sliding_window`` is set; Qwen2/Qwen3 only with ``use_sliding_window``, the
    layers ``layer_types`` names (else those from ``max_window_layers`` on); Gemma 3 the ``"sliding_attention"``
    layers of ``layer_types`` (else all but every ``sliding_window_pattern``-th); Llama none."""
    family = MOE_ATTENTION.get(family, family)
    window = _field(config, "sliding_window") or 0
    if family in ("qwen2", "qwen3") and not _field(config, "use_sliding_window"):
        window = 0
    if not window or family == "llama":
        return 0, 0
    types = _field(config, "layer_types")
    if family in ("gemma3_text", "qwen2", "qwen3") and types:
        count = sum(1 for t in types if t == "sliding_attention")
    elif family == "gemma3_text":
        pattern = _field(config, "sliding_window_pattern") or 6
        count = sum(1 for i in range(layers) if (i + 1) % pattern)
    elif family in ("qwen2", "qwen3"):
        count = max(0, layers - (_field(config, "max_window_layers") or 0))
    else:
        count = layers
    return (window, count) if count else (0, 0)


def _experts(config: Any, family: str, layers: int) -> dict[str, Any]:
    """The MoE fields of a Hugging Face ``config`` of a :data:`MOE_FAMILIES` family ({} for the others), as
    transformers builds the model: Mixtral's ``num_local_experts`` of ``intermediate_size`` and its always
    renormalised top-k; Qwen2/3-MoE's and OLMoE's ``num_experts``, their ``moe_intermediate_size`` (OLMoE:
    ``intermediate_size``) and ``norm_topk_prob``; Qwen2-MoE's shared expert; a layer ``i`` is dense when it is in
    ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step`` is not 0 (Qwen2/3-MoE)."""
    if family not in MOE_FAMILIES:
        return {}
    count = _field(config, "num_local_experts" if family == "mixtral" else "num_experts")
    width = _field(config, "moe_intermediate_size" if family in ("qwen2_moe", "qwen3_moe") else "intermediate_size")
    dense: tuple[int, ...] = ()
    if family in ("qwen2_moe", "qwen3_moe"):
        step = _field(config, "decoder_sparse_step") or 1
        only = set(_field(config, "mlp_only_layers") or ())
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    return {"experts": count, "top_k": _field(config, "num_experts_per_tok"), "expert_ffn": width,
            "shared_expert_ffn": (_field(config, "shared_expert_intermediate_size") or 0) if family == "qwen2_moe"
            else 0, "router_scoring": _field(config, "scoring_func") or "softmax",
            "norm_topk_prob": True if family == "mixtral" else bool(_field(config, "norm_topk_prob", False)),
            "dense_layers": dense}


def _field(config: Any, key: str, default: Any = None) -> Any:
    """``key`` of a Hugging Face config: a mapping (a config.json's dict) or an object (a ``PretrainedConfig``)."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


#: the sequence length a Hugging Face config is priced and dry-run at unless ``--seq`` says otherwise
CONFIG_SEQ = 2048


def is_config_path(model: str) -> bool:
    """Whether a ``--model`` names a Hugging Face config.json (a path to one, or a folder) rather than a named size:
    it ends in ``.json``, holds a path separator or is a folder (so a missing file is reported as one)."""
    return model.endswith(".json") or os.sep in model or os.path.isdir(model)


def hf_head_dim(config: Any) -> int:
    """The attention head size of a Hugging Face ``config``: its ``head_dim`` when set (Gemma's is not
    ``hidden / heads``), else ``hidden_size / num_attention_heads``."""
    return _field(config, "head_dim") or _field(config, "hidden_size") // _field(config, "num_attention_heads")


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer's shape (module docstring): ``layers`` blocks of hidden size ``hidden`` with
    ``heads`` attention heads (``kv_heads`` key-value heads, each ``head_dim`` wide), MLP width ``ffn``, at most
    ``seq`` tokens per sequence, ``vocab`` tokens; ``name`` for logs and tables; ``path``: the config.json it was
    read from ("" for the others; the runtime builds a Hugging Face model from it). ``head_norms``: RMS norms over
    each head's features of q and k (Qwen3, Gemma 3); ``sliding_window``: the attention window of the
    ``sliding_layers`` layers that have one (Mistral's, Gemma 3's local layers; 0: every layer attends to the whole
    sequence). A mixture of experts (:data:`MOE_FAMILIES`): ``experts`` routed experts of width ``expert_ffn``,
    ``top_k`` of them per token, scored by ``router_scoring`` ("softmax" or "sigmoid"), the chosen weights
    renormalised with ``norm_topk_prob``; ``shared_expert_ffn`` the width of Qwen2-MoE's shared expert (0: none);
    ``dense_layers`` the layers whose MLP is dense (``ffn`` wide) instead. Dense families leave them 0 / ().

    Defaults: ``ffn`` 4·hidden, ``kv_heads`` = heads, ``head_dim`` = hidden / heads, filled in on construction, so
    ``dataclasses.replace`` keeps them: with a new ``hidden`` or ``heads`` pass them as None too where they should
    follow (:meth:`named` does so for ``kv_heads`` and ``head_dim``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = GPT2_PADDED_VOCAB
    bias: bool = True
    ffn: Optional[int] = None
    family: str = "gpt"
    kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    tied: bool = False
    attention_bias: bool = False
    output_bias: bool = False
    mlp_bias: bool = False
    path: str = ""
    head_norms: bool = False
    sliding_window: int = 0
    sliding_layers: int = 0
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    router_scoring: str = "softmax"
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"TransformerShape.family={self.family!r}: choose one of {', '.join(FAMILIES)}")
        for f in ("layers", "hidden", "heads", "seq", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TransformerShape.{f}={v!r} must be an integer >= 1")
        for f, default in (("ffn", 4 * self.hidden), ("kv_heads", self.heads),
                           ("head_dim", self.hidden // self.heads)):
            v = getattr(self, f)
            if v is None:
                object.__setattr__(self, f, default)
            elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TransformerShape.{f}={v!r} must be an integer >= 1 (or None for {default})")
        if not (0 <= self.sliding_layers <= self.layers) or self.sliding_window < 0:
            raise ValueError(f"TransformerShape {self.name}: sliding_window={self.sliding_window} over "
                             f"sliding_layers={self.sliding_layers} of {self.layers} layers; give a window >= 0 and "
                             f"0 <= sliding_layers <= layers")
        self._check_experts()
        if self.family == "gpt":
            if self.hidden % self.heads:
                raise ValueError(f"TransformerShape {self.name}: hidden={self.hidden} is not divisible by "
                                 f"heads={self.heads}; choose heads dividing hidden (head size = hidden / heads)")
            hf_only = [f for f, v, plain in (("kv_heads", self.kv_heads, self.heads),
                                             ("head_dim", self.head_dim, self.hidden // self.heads),
                                             ("tied", self.tied, False), ("attention_bias", self.attention_bias, False),
                                             ("output_bias", self.output_bias, False),
                                             ("mlp_bias", self.mlp_bias, False),
                                             ("head_norms", self.head_norms, False),
                                             ("sliding_window", self.sliding_window, 0)) if v != plain]
            if hf_only:
                raise ValueError(f"TransformerShape {self.name}: {', '.join(hf_only)} describe the Hugging Face "
                                 f"decoders ({', '.join(DECODER_FAMILIES)}), not the GPT block; leave them unset "
                                 f"for family 'gpt'")
        else:
            if self.heads % self.kv_heads:
                raise ValueError(f"TransformerShape {self.name}: heads={self.heads} is not a multiple of "
                                 f"kv_heads={self.kv_heads}")
            if self.bias:
                raise ValueError(f"TransformerShape {self.name}: bias is the GPT block's; a {self.family} shape "
                                 f"says its biases with attention_bias, output_bias and mlp_bias (give bias=False)")

    def _check_experts(self) -> None:
        """The MoE fields: set (and consistent) for a :data:`MOE_FAMILIES` shape, unset for the others."""
        moe = (self.experts, self.top_k, self.expert_ffn, self.shared_expert_ffn, self.dense_layers)
        if self.family not in MOE_FAMILIES:
            if any(moe) or self.norm_topk_prob:
                raise ValueError(f"TransformerShape {self.name}: experts, top_k, expert_ffn, shared_expert_ffn, "
                                 f"norm_topk_prob and dense_layers describe a mixture of experts "
                                 f"({', '.join(MOE_FAMILIES)}), not family {self.family!r}; leave them unset")
            return
        for f in ("experts", "top_k", "expert_ffn"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TransformerShape {self.name}: {f}={v!r} must be an integer >= 1 for a "
                                 f"{self.family} mixture of experts")
        if self.top_k > self.experts:
            raise ValueError(f"TransformerShape {self.name}: top_k={self.top_k} experts per token is more than the "
                             f"{self.experts} experts; give top_k <= experts")
        if self.router_scoring not in ROUTER_SCORINGS:
            raise ValueError(f"TransformerShape {self.name}: router_scoring={self.router_scoring!r}; choose one of "
                             f"{', '.join(ROUTER_SCORINGS)}")
        if self.shared_expert_ffn and self.family != "qwen2_moe" or self.shared_expert_ffn < 0:
            raise ValueError(f"TransformerShape {self.name}: shared_expert_ffn={self.shared_expert_ffn} is "
                             f"Qwen2-MoE's shared expert; give 0 for {self.family}")
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))
        if any(not 0 <= i < self.layers for i in self.dense_layers):
            raise ValueError(f"TransformerShape {self.name}: dense_layers={list(self.dense_layers)} must be layer "
                             f"indices in [0, {self.layers})")

    # -- constructors -------------------------------------------------------------------------------------
    @staticmethod
    def named(name: str, **changes: Any) -> "TransformerShape":
        """The named GPT size ``name`` (any case; ``axgrid.spec.NAMED_SIZES``) with ``changes`` to its fields; an
        unknown name or field raises a ValueError listing the known ones. The head size and key-value heads follow
        changed ``hidden`` / ``heads``; ``ffn`` stays the named size's (4·its hidden) unless given, as the runtime's
        ``GPTConfig.named`` has always built it (the runs recorded with ``--hidden`` were made so)."""
        from .sizes import NAMED_SIZES, PUBLIC_MODELS
        try:
            shape = {**NAMED_SIZES, **PUBLIC_MODELS}[name.lower()]
        except (KeyError, AttributeError):
            raise ValueError(f"unknown model {name!r}; choose a GPT size ({', '.join(NAMED_SIZES)}), a public model "
                             f"({', '.join(PUBLIC_MODELS)}), or give --config path/to/config.json (a Hugging Face "
                             f"config or its folder)") from None
        known = {f.name for f in fields(TransformerShape)}
        bad = set(changes) - known
        if bad:
            raise ValueError(f"unknown TransformerShape field(s) {sorted(bad)}; fields are {sorted(known)}")
        if not changes:
            return shape
        follow = {"kv_heads": None, "head_dim": None} if shape.is_gpt else {}
        return replace(shape, **{**follow, **changes})

    @staticmethod
    def from_hf_config(config: Any, seq: int, name: str = "", path: str = "") -> "TransformerShape":
        """The shape of a Hugging Face ``config`` (a config.json's dict or a ``PretrainedConfig``) trained on
        ``seq``-token sequences; a family that is none of :data:`DECODER_FAMILIES`, or a config
        without the sizes, raises a ValueError in one line. ``name`` defaults to the ``model_type``."""
        family = _field(config, "model_type")
        if family == GEMMA3_MULTIMODAL and _field(config, "text_config") is not None:
            config, family = _field(config, "text_config"), "gemma3_text"      # the text decoder
        if family not in DECODER_FAMILIES:
            kind = ", ".join(_field(config, "architectures") or [])
            raise ValueError(f"model_type {family!r} ({kind}) is not a family the dry run models; use a config of "
                             f"{', '.join(sorted(DECODER_FAMILIES))} (or gemma3 with a text_config) or a named size")
        if isinstance(config, Mapping):
            config = {**HF_DEFAULTS.get(family, {}), **config}
        need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in need if not isinstance(_field(config, k), int)]
        if missing:
            raise ValueError(f"{', '.join(missing)} missing or not an integer; a {family} config.json states them")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise ValueError(f"sequence length {seq!r}: give a positive --seq")
        heads, layers = _field(config, "num_attention_heads"), _field(config, "num_hidden_layers")
        asked = bool(_field(config, "attention_bias", False))
        attention = MOE_ATTENTION.get(family, family)
        attention_bias = ((family == "qwen2") or (family == "qwen2_moe" and bool(_field(config, "qkv_bias", True)))
                          or (asked and attention in ("llama", "qwen3", "gemma3_text")))
        window, sliding = _sliding(config, family, layers)
        return TransformerShape(
            name or family, layers, _field(config, "hidden_size"), heads, seq,
            _field(config, "vocab_size"), bias=False, ffn=_field(config, "intermediate_size"), family=family,
            kv_heads=_field(config, "num_key_value_heads") or heads, head_dim=hf_head_dim(config),
            tied=bool(_field(config, "tie_word_embeddings", False)), attention_bias=attention_bias,
            output_bias=attention_bias and attention != "qwen2",
            mlp_bias=family == "llama" and bool(_field(config, "mlp_bias", False)), path=path,
            head_norms=attention in ("qwen3", "gemma3_text") or family == "olmoe", sliding_window=window,
            sliding_layers=sliding, **_experts(config, family, layers))

    @staticmethod
    def from_config_json(path: str, seq: int) -> "TransformerShape":
        """:meth:`from_hf_config` of the config.json at ``path`` (or in the folder ``path``), named after its folder
        (or after the file when it is not called config.json); errors name the file."""
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise ValueError(f"{path}: no such config.json; give a Hugging Face config.json (or its folder)")
        try:
            with open(file) as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{file}: not a readable JSON config ({e})") from None
        stem = os.path.splitext(os.path.basename(file))[0]
        name = os.path.basename(os.path.dirname(os.path.abspath(file))) if stem == "config" else stem
        try:
            return TransformerShape.from_hf_config(config, seq, str(name), os.path.abspath(file))
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None

    @staticmethod
    def from_vtrain_row(row: Mapping[str, Any], vocab: int = GPT2_PADDED_VOCAB) -> "TransformerShape":
        """The GPT of one vTrain ground-truth row (its ``hidden``, ``heads``, ``layers`` and ``seq`` columns;
        Megatron-LM's GPT-2 vocabulary padded to ``vocab``), named ``vtrain-h<hidden>-a<heads>-l<layers>``."""
        return TransformerShape(f"vtrain-h{row['hidden']}-a{row['heads']}-l{row['layers']}", int(row["layers"]),
                                int(row["hidden"]), int(row["heads"]), seq=int(row["seq"]), vocab=vocab)

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` fields of this shape for a Hugging Face decoder: its file's when it was read from one
        (``path``), else what :meth:`from_hf_config` reads back to this shape (name and path aside; rotary, norm
        epsilon and initialiser at the family's defaults), so a named public model is built without its file. Gemma
        3's sliding layers are written as a ``sliding_window_pattern`` when one gives their count, else as
        ``layer_types`` with the first ``sliding_layers`` local. The GPT has none: a ValueError."""
        if self.is_gpt:
            raise ValueError(f"TransformerShape {self.name}: the GPT is axgrid's own model, not a Hugging Face config")
        if self.path:
            with open(self.path) as f:
                return json.load(f)
        out: dict[str, Any] = {
            "model_type": self.family, "architectures": [DECODER_FAMILIES[self.family]], "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.ffn, "vocab_size": self.vocab,
            "max_position_embeddings": max(self.seq, 2048), "tie_word_embeddings": self.tied,
            "attention_bias": self.attention_bias if self.family not in ("qwen2", "qwen2_moe") else False,
            "mlp_bias": self.mlp_bias, "sliding_window": self.sliding_window or None}
        if self.family != "gemma3_text":
            out["hidden_act"] = "silu"
        if self.is_moe:
            out.update(self._hf_experts())
        if self.family == "phi3":
            del out["head_dim"]                                  # Phi-3 reads h / H
            out.update(pad_token_id=0, bos_token_id=min(1, self.vocab - 1), eos_token_id=min(2, self.vocab - 1))
        if self.family == "gemma3_text":
            patterns = [p for p in range(2, self.layers + 2)
                        if sum(1 for i in range(self.layers) if (i + 1) % p) == self.sliding_layers]
            if patterns and self.sliding_window:
                out["sliding_window_pattern"] = patterns[0]
            else:
                out["layer_types"] = ["sliding_attention" if i < self.sliding_layers else "full_attention"
                                      for i in range(self.layers)]
                out["sliding_window"] = self.sliding_window or 4096     # the default; no layer uses it when 0
        if self.family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            out.update(use_sliding_window=bool(self.sliding_window), max_window_layers=self.layers - self.sliding_layers)
        if self.family in ("mistral", "phi3", "mixtral") and self.sliding_layers not in (0, self.layers):
            raise ValueError(f"TransformerShape {self.name}: {self.family} applies its sliding_window to every layer, "
                             f"not {self.sliding_layers} of {self.layers}; give sliding_layers 0 or {self.layers}")
        return out

    def _hf_experts(self) -> dict[str, Any]:
        """The config.json fields of the MoE fields (what :func:`_experts` reads back)."""
        if self.router_scoring != "softmax":
            raise ValueError(f"TransformerShape {self.name}: {self.family} routes with softmax in transformers, not "
                             f"{self.router_scoring}")
        if self.family == "mixtral":
            if not self.norm_topk_prob:
                raise ValueError(f"TransformerShape {self.name}: Mixtral always renormalises its top-k weights; "
                                 f"give norm_topk_prob=True")
            return {"num_local_experts": self.experts, "num_experts_per_tok": self.top_k,
                    "intermediate_size": self.expert_ffn}
        out: dict[str, Any] = {"num_experts": self.experts, "num_experts_per_tok": self.top_k,
                               "norm_topk_prob": self.norm_topk_prob}
        if self.family == "olmoe":
            return {**out, "intermediate_size": self.expert_ffn}
        out.update(moe_intermediate_size=self.expert_ffn, decoder_sparse_step=1,
                   mlp_only_layers=list(self.dense_layers))
        if self.family == "qwen2_moe":
            out.update(shared_expert_intermediate_size=self.shared_expert_ffn, qkv_bias=self.attention_bias)
        return out

    # -- what follows -------------------------------------------------------------------------------------
    @property
    def is_gpt(self) -> bool:
        """Whether this is axgrid's GPT block (else a Hugging Face decoder, :data:`DECODER_FAMILIES`)."""
        return self.family == "gpt"

    @property
    def is_moe(self) -> bool:
        """Whether this is a mixture of experts (:data:`MOE_FAMILIES`)."""
        return self.family in MOE_FAMILIES

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the routed experts (all but ``dense_layers``; 0 for a dense family)."""
        return self.layers - len(self.dense_layers) if self.is_moe else 0

    def expert_layers(self) -> list[FCLayer]:
        """One routed expert's FC layers in forward order, each a 3D Linear as a dense MLP's: gate and up normal
        ``[f_e, h]``, down transposed ``[h, f_e]`` (no biases); [] for a dense family."""
        if not self.is_moe:
            return []
        f, h = self.expert_ffn, self.hidden
        return [FCLayer(f, h, False, False, "experts.gate_proj"), FCLayer(f, h, False, False, "experts.up_proj"),
                FCLayer(h, f, True, False, "experts.down_proj")]

    def router_parameters(self) -> int:
        """Elements of one MoE layer's dense MLP tensors that are no FC layer of the grid: the router ``[E, h]``
        and Qwen2-MoE's shared-expert gate ``[1, h]`` (0 for a dense family)."""
        if not self.is_moe:
            return 0
        return self.hidden * (self.experts + (1 if self.shared_expert_ffn else 0))

    def head_norm_widths(self) -> tuple[int, int]:
        """Features of the q and k norms' weights: one head's ``head_dim`` each (Qwen3, Gemma 3, Qwen3-MoE), the
        whole q and k widths (OLMoE's); (0, 0) without ``head_norms``."""
        if not self.head_norms:
            return 0, 0
        if self.family == "olmoe":
            return self.attention_width, self.kv_heads * self.head_dim
        return self.head_dim, self.head_dim

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (SwiGLU/GeGLU: act(gate)·up, three weight matrices) rather than the GPT's
        up-GELU-down."""
        return not self.is_gpt

    def block_layers(self) -> list[FCLayer]:
        """One block's FC layers in forward order, as the runtime builds them (``axgrid.models.gpt``; for a Hugging
        Face decoder ``axgrid.plans.hf``'s plan): the GPT's QKV, attention-out, MLP-up, MLP-down
        (``axgrid.spec.block_layers``); the Llama structure's q, k, v, o, gate, up, down (Qwen3's and Gemma 3's
        too, Gemma's with its post norms after o and down); Phi-3's fused qkv, o, fused gate_up, down."""
        if self.is_gpt:
            return block_layers(self.hidden, ffn=self.ffn, bias=self.bias)
        h, f, qd, kvd = self.hidden, self.ffn, self.heads * self.head_dim, self.kv_heads * self.head_dim
        ab, mb = self.attention_bias, self.mlp_bias
        if self.family == "phi3":
            return [FCLayer(qd + 2 * kvd, h, False, False, "qkv_proj", norm="input_layernorm", attention=True),
                    FCLayer(h, qd, True, False, "o_proj"),
                    FCLayer(2 * f, h, False, False, "gate_up_proj", norm="post_attention_layernorm"),
                    FCLayer(h, f, True, False, "down_proj")]
        gemma = self.family == "gemma3_text"
        if self.is_moe:          # the dense FC layers; the router and the experts: router_parameters, expert_layers
            f, out = self.shared_expert_ffn, self.output_bias
            if not f:            # no dense layer reads post_attention_layernorm: it closes the attention (same norm)
                return [FCLayer(qd, h, False, ab, "q_proj", norm="input_layernorm", attention=True),
                        FCLayer(kvd, h, False, ab, "k_proj"), FCLayer(kvd, h, False, ab, "v_proj"),
                        FCLayer(h, qd, True, out, "o_proj", post_norm="post_attention_layernorm")]
            return [FCLayer(qd, h, False, ab, "q_proj", norm="input_layernorm", attention=True),
                    FCLayer(kvd, h, False, ab, "k_proj"), FCLayer(kvd, h, False, ab, "v_proj"),
                    FCLayer(h, qd, True, out, "o_proj"),
                    FCLayer(f, h, False, False, "shared_expert.gate_proj", norm="post_attention_layernorm"),
                    FCLayer(f, h, False, False, "shared_expert.up_proj"),
                    FCLayer(h, f, True, False, "shared_expert.down_proj")]
        return [FCLayer(qd, h, False, ab, "q_proj", norm="input_layernorm", attention=True),
                FCLayer(kvd, h, False, ab, "k_proj"), FCLayer(kvd, h, False, ab, "v_proj"),
                FCLayer(h, qd, True, self.output_bias, "o_proj", post_norm="post_attention_layernorm" if gemma else ""),
                FCLayer(f, h, False, mb, "gate_proj",
                        norm="pre_feedforward_layernorm" if gemma else "post_attention_layernorm"),
                FCLayer(f, h, False, mb, "up_proj"),
                FCLayer(h, f, True, mb, "down_proj", post_norm="post_feedforward_layernorm" if gemma else "")]

    def head_layer(self) -> FCLayer:
        """The LM head ``[V, h]`` after the final norm: no bias, never recomputed."""
        if self.is_gpt:
            return head_layer(self.hidden, self.vocab)
        return FCLayer(self.vocab, self.hidden, False, False, "lm_head", recompute=False, norm="norm")

    def block_modules(self) -> tuple[str, ...]:
        """One block's hidden-width norms and FC layers in forward order (the GPT's ``model.parameters()`` order;
        a Hugging Face decoder registers its norms after the FC layers, ``axgrid.perfmodel.parameters``)."""
        return block_modules(self.block_layers())

    def block_norms(self) -> int:
        """Hidden-width norms in one block (those the block layers' ``norm`` and ``post_norm`` name): 2 (Gemma 3:
        4). The head norms (``head_norms``: q_norm and k_norm over ``head_dim``) are not among them."""
        return sum(bool(layer.norm) + bool(layer.post_norm) for layer in self.block_layers())

    def layer_norms(self) -> int:
        """Hidden-width norms in the model: every block's and the final one: 2L + 1 (Gemma 3: 4L + 1)."""
        return self.layers * self.block_norms() + (1 if self.head_layer().norm else 0)

    @property
    def params(self) -> int:
        """Dense parameter count: the GPT's ``axgrid.spec.gpt_parameters`` (blocks, embeddings V·h + S·h, untied
        head V·h); a Hugging Face decoder's FC layers (weights and biases), its hidden-width RMSNorms (h each), its
        head norms (2 per layer, ``head_dim`` each), the token table V·h and the head V·h unless tied."""
        if self.is_gpt:
            return gpt_parameters(self.layers, self.hidden, self.seq, self.vocab, self.ffn, self.bias)
        return self._parameters(self.experts)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: :attr:`params` with ``top_k`` routed experts per MoE layer
        instead of all ``experts`` (= :attr:`params` for a dense model)."""
        return self._parameters(self.top_k) if self.is_moe else self.params

    def _parameters(self, experts: int) -> int:
        """The decoder's parameters with ``experts`` routed experts per MoE layer (a dense layer: gate, up, down
        of ``ffn``)."""
        block = sum(layer.n * layer.k + (layer.n if layer.bias else 0) for layer in self.block_layers())
        block += self.block_norms() * self.hidden + sum(self.head_norm_widths())
        head = self.head_layer()
        total = self.layers * block + self.hidden + self.vocab * self.hidden + (0 if self.tied else head.n * head.k)
        if self.is_moe:
            expert = sum(layer.n * layer.k for layer in self.expert_layers())
            total += self.moe_layers * (experts * expert + self.router_parameters())
            total += len(self.dense_layers) * 3 * self.hidden * self.ffn
        return total

    @property
    def norm_kind(self) -> str:
        """"layernorm" (the GPT's: mean and variance, a weight and a bias) or "rmsnorm" (the decoders': the mean
        square only, a weight)."""
        return "layernorm" if self.is_gpt else "rmsnorm"

    @property
    def norm_parameters(self) -> int:
        """Parameter vectors of one norm, each ``hidden`` long: a LayerNorm's weight and bias (2), an RMSNorm's
        weight (1)."""
        return 2 if self.norm_kind == "layernorm" else 1

    @property
    def attention_width(self) -> int:
        """Features of the attention's queries (and of its output): ``heads · head_dim`` (``hidden`` for the GPT;
        Qwen3 and Gemma 3 set their own head size)."""
        return self.heads * self.head_dim

    def attended_keys(self, seq: Optional[int] = None) -> float:
        """The key span per query averaged over the layers, counted as the dense ``S × S`` convention counts causal
        attention (``S`` for a layer without a window, though a causal query reads ``S/2`` keys on average): a
        layer with a window ``W < S`` reads ``W − W²/(2S)`` keys on average, so ``2W − W²/S`` here."""
        S = seq or self.seq
        W = self.sliding_window
        windowed = S if (W <= 0 or W >= S) else 2 * W - W * W / S
        return (self.sliding_layers * windowed + (self.layers - self.sliding_layers) * S) / self.layers

    def flops_per_iteration(self, batch: int, recompute: bool, seq: Optional[int] = None) -> float:
        """FLOPs of one training iteration on ``batch`` sequences of ``seq`` tokens (default the shape's),
        ``recompute`` with full activation recompute (one more forward of the blocks). The GPT:
        ``axgrid.spec.gpt_flops_per_iteration``. A decoder: ``(6 + 2r)·T·(P + 2·L·K·a)`` with ``T`` the tokens,
        ``P`` the elements of its FC weights (blocks and head, tied or not: the head's GEMM runs), ``a`` the
        attention width, ``K`` :meth:`attended_keys` and ``r = 1`` with recompute (as
        ``axgrid.spec.llama_flops`` counts a config without windows; the head is recomputed too there)."""
        S = seq or self.seq
        if self.is_gpt:
            return gpt_flops_per_iteration(batch, S, self.layers, self.hidden, self.vocab, recompute)
        head = self.head_layer()
        matrices = self.layers * sum(layer.n * layer.k for layer in self.block_layers()) + head.n * head.k
        if self.is_moe:          # each token through top_k experts and the router (active weights)
            expert = sum(layer.n * layer.k for layer in self.expert_layers())
            matrices += self.moe_layers * (self.top_k * expert + self.router_parameters())
            matrices += len(self.dense_layers) * 3 * self.hidden * self.ffn
        tokens = batch * S
        return (6 + 2 * int(recompute)) * tokens * (matrices + 2 * self.layers * self.attended_keys(S)
                                                    * self.attention_width)

    def grid_rules(self) -> list[tuple[str, int, str]]:
        """(what, size, dim): each size that grid dimension ``dim`` splits, so ``G_dim`` must divide it (the GPT's
        layers: ``axgrid.models.gpt``; a Hugging Face decoder's: ``axgrid.plans.transformer.resolve``)."""
        if self.is_gpt:
            return [("hidden", self.hidden, "x"), ("hidden", self.hidden, "y"), ("heads", self.heads, "y"),
                    ("ffn", self.ffn, "x"), ("ffn", self.ffn, "y"), ("vocab", self.vocab, "y")]
        if self.is_moe:
            rules = [("hidden_size", self.hidden, "x"), ("num_attention_heads", self.heads, "y"),
                     ("num_key_value_heads", self.kv_heads, "y"), ("expert_ffn", self.expert_ffn, "y"),
                     ("vocab_size", self.vocab, "y")]
            if self.shared_expert_ffn:
                rules.append(("shared_expert_intermediate_size", self.shared_expert_ffn, "y"))
            if self.dense_layers:
                rules.append(("intermediate_size", self.ffn, "y"))
            return rules
        return [("hidden_size", self.hidden, "x"), ("num_attention_heads", self.heads, "y"),
                ("num_key_value_heads", self.kv_heads, "y"), ("intermediate_size", self.ffn, "y"),
                ("vocab_size", self.vocab, "y")]

    def divisibility(self, grid: tuple[int, int, int, int]) -> list[str]:
        """What of the shape does not divide ``grid`` (:meth:`grid_rules`), each naming the value and the
        dimension; [] when it fits."""
        size = dict(zip("xyzd", grid))
        return [f"{what} {value} not divisible by G{dim}={size[dim]}" for what, value, dim in self.grid_rules()
                if value % size[dim]]


__all__ = ["CONFIG_SEQ", "is_config_path", "DECODER_FAMILIES", "MOE_FAMILIES", "ROUTER_SCORINGS", "FAMILIES", "GPT2_PADDED_VOCAB", "TransformerShape", "hf_head_dim"]
