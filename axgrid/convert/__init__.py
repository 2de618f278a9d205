"""Other checkpoint formats into Hugging Face folders that ``axgrid.from_pretrained`` reads.

===============  =================================================================================
:mod:`.gguf`     :func:`convert_gguf`: a GGUF file (llama.cpp's format) into a folder with fp32 safetensors, the
                 tokenizer and its chat template, cached by the file's SHA-256 (``python -m axgrid.convert gguf``)
===============  =================================================================================
"""
from .gguf import ConvertError, ConvertResult, convert_gguf, resolve_gguf

__all__ = ["ConvertError", "ConvertResult", "convert_gguf", "resolve_gguf"]
