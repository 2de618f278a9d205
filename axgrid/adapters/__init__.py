"""Parameter-efficient fine-tuning on a parallelized model: LoRA adapters (:mod:`.lora`: add, fold in) and PEFT's
adapter format (:mod:`.peft_format`: save, load). The per-layer math is :mod:`axgrid.adapters.layer`."""
from .lora import LoraConfig, adapters, lora, merge_lora
from .peft_format import load_adapter, save_adapter

__all__ = ["LoraConfig", "adapters", "lora", "merge_lora", "load_adapter", "save_adapter"]
