"""Fine-tune a Hugging Face model on the grid: load it with ``axgrid.from_pretrained`` (each rank reads only its own
parts), train a few steps, generate, and export it back to a Hugging Face folder.

    python examples/finetune_hf.py --make-tiny runs/tiny-llama       # once: a random tiny Llama, save_pretrained
    axgrid launch -n 4 -- python examples/finetune_hf.py --checkpoint runs/tiny-llama --grid 1x2x1x2 \\
        --export runs/tiny-llama-ft

The tiny model needs no download. Any LLaMA-family folder (Llama, Mistral, Qwen2) loads the same way; this example
feeds it the shipped text as bytes (ids 0-255), which suits the tiny model's 256-entry vocabulary. For a real model
with its tokenizer, Goldfish, checkpoints and metrics, use experiments/train/finetune.py.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import torch

import axgrid
from axgrid.data import DEFAULT_TEXT, TextBatches


def make_tiny(path: str, seed: int = 0) -> str:
    """Write a random tiny Llama (vocabulary 256: bytes) to ``path`` with ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--make-tiny", metavar="DIR", help="write a random tiny Llama to DIR and stop")
    ap.add_argument("--checkpoint", metavar="DIR", help="a Hugging Face model folder (save_pretrained)")
    ap.add_argument("--grid", default="1x2x1x2")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--export", metavar="DIR", help="write the fine-tuned model here (a Hugging Face folder)")
    args = ap.parse_args(argv)
    if args.make_tiny:
        print(f"wrote {make_tiny(args.make_tiny)}")
        return {}
    if not args.checkpoint:
        ap.error("give --checkpoint DIR (or --make-tiny DIR first)")

    grid = axgrid.init(args.grid)
    model = axgrid.from_pretrained(args.checkpoint, grid).train()   # the built-in LLaMA-family plan
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = TextBatches(DEFAULT_TEXT, args.seq, seed=0)             # byte windows, the same on every rank

    losses = []
    for step in range(args.steps):
        inputs, targets = data.batch(step, args.batch)                     # [B, S] each, the global batch
        ids, labels = axgrid.local_batch(inputs, grid), axgrid.local_batch(targets, grid)   # [B/Gd, S]
        # shift_labels: the targets are already the next bytes (no shift inside the model); the loss is the mean
        # over this rank's tokens, and sync_gradients (inside train_step) averages over d
        out = axgrid.train_step(model, opt, lambda _: model(input_ids=ids, labels=labels, shift_labels=labels).loss,
                                grid, clip=1.0)
        losses.append(float(grid.comm.all_reduce(out.loss.reshape(1), "d", average=True)[0]))
        if grid.rank == 0:
            print(f"step {step}: loss {losses[-1]:.4f}")

    model.eval()
    prompt = torch.tensor([list(b"In the beginning")])                   # one prompt: generate pads the batch
    tokens = axgrid.generate(model, prompt, grid, max_new_tokens=16)      # [1, 16 + n], n <= 16 (the EOS), every rank
    if grid.rank == 0:
        print("generated:", bytes(tokens[0].tolist()).decode("utf-8", errors="replace"))
    if args.export:
        axgrid.export_pretrained(model, args.export, grid)                # rank 0 writes a dense folder
        if grid.rank == 0:
            print(f"exported to {args.export}")
    grid.destroy()
    return {"losses": losses, "tokens": tokens}


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "finetune_hf")     # errors said once, as one line (axgrid.launch.errors)
