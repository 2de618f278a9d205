"""The memorization study in one command: train on N passages for E epochs with the standard loss and with
Goldfish, then measure how much of each passage the model reproduces verbatim, and how well it learned the text.

    axgrid launch -n 4 -- python experiments/train/memorization.py --out results/memorization
    axgrid launch -n 4 -- python experiments/train/memorization.py --checkpoint HF_FOLDER --grid 2x1x1x2 --out DIR
    axgrid launch -n 4 -- python experiments/train/memorization.py --eval-only DIR/standard --out DIR/eval

Data (``--text-file``, default the shipped KJV selections; byte-level for axgrid's GPT, the checkpoint's tokenizer
with ``--checkpoint``): the token stream is cut into three disjoint parts: N passages of ``P + C`` tokens (the
first ``N·(P+C)`` tokens), the held-out text (the last ``--heldout-frac``: never trained on) and the other text
(everything between). Each optimizer step's global batch is ``--batch`` sequences: ``--batch - --other`` passages
(each epoch visits every passage once, in a seeded order) and ``--other`` random windows of the other text, so
the model learns the language while it sees the passages E times. With ``--data-path`` (a corpus preprocessed by
``python -m axgrid.data preprocess``, ``--split``) the passages and the other text are the train split's first
tokens and the held-out text is the validation split's (:func:`axgrid.data.split_tokens`).

Training (per loss, from the same initial weights and the same batches): axgrid's GPT from scratch (``--model``
a named size of axgrid.spec, overridden by ``--layers/--hidden/--heads``), or the Hugging Face checkpoint
(``--checkpoint``), fine-tuned; one step is :func:`axgrid.driver.run_step` (AdamW, warm-up + cosine
decay, clipping, micro-batches, Goldfish normalised over the step's global batch). ``--losses`` names the runs:
``standard`` and ``goldfish`` (``--goldfish-k 4 --goldfish-mode hash --goldfish-h 13`` by default).

Scores (axgrid.memorization.scores; every ``--eval-every`` epochs and at the end): each passage's first P tokens
prompt ``axgrid.generate`` (greedy) for C tokens; exact-match rate (all C right), token accuracy, ROUGE-L against
the true continuation; and the mean loss per token on ``--heldout`` windows of the held-out text (standard
cross entropy, no Goldfish mask). Written under ``--out DIR``: ``memorization.json`` (``{"standard":
{"exact_match", "token_accuracy", "rouge_l", "heldout_loss", "epochs_to_80"}, "goldfish": {...}, "settings":
{...}}``; one key per run of ``--losses``; ``epochs_to_80``: the first evaluated epoch at which at least 80% of the
passages are reproduced exactly, None when none is), the printed table (``memorization.txt``), each run's per-step rows
(``<loss>.jsonl``, :mod:`axgrid.metrics`), ``curves.json`` (the scores at every evaluation),
``memorization.png`` (exact match and ROUGE-L against epochs for both losses, and held-out loss), and each run's
final model (``DIR/<loss>/``: an axgrid checkpoint for the GPT, a Hugging Face folder for ``--checkpoint``),
which ``--eval-only`` measures.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

import axgrid
from axgrid.data import DEFAULT_TEXT, DataError, TokenWindows, encode, load_tokenizer, split_tokens
from axgrid.driver import (StepSettings, add_data_arguments, add_step_arguments, check_data_arguments,
                           check_output_paths, check_step_arguments, compute_dtype, data_settings, parse_step_args,
                           run_step)
from axgrid.launch.errors import run, usage_errors_raise
from axgrid.memorization import score_continuations
from axgrid.metrics import Metrics
from axgrid.models import GPT, GPTConfig
from axgrid.plans.causal_lm import causal_lm_loss, load_causal_lm
from axgrid.spec import TransformerShape, llama_flops
from axgrid.train import decay_groups

LOSSES = ("standard", "goldfish")
#: The exact-match rate that counts as memorized (``epochs_to_80`` in the results)
MEMORIZED = 0.8
#: The study's defaults, by what it trains (an option given on the command line wins): axgrid's GPT from scratch
#: (``scratch``), or a pretrained Hugging Face model fine-tuned (``pretrained``: ``--checkpoint``, or ``--eval-only``
#: of a Hugging Face folder). Both are the settings of the runs in docs/results.md ("The memorization study"): the
#: pretrained model is fine-tuned at a tenth of the learning rate, for a tenth of the epochs, on half the passages
#: and no other text (a step of SmolLM2-135M costs ~100 times one of gpt-mini here).
DEFAULTS = {
    "scratch": dict(passages=32, epochs=120, eval_every=20, batch=24, other=8, heldout=64, lr=4e-3, warmup=10),
    "pretrained": dict(passages=16, epochs=12, eval_every=3, batch=16, other=0, heldout=16, lr=3e-4, warmup=1),
}
#: what a saved GPT records (its ``extra["gpt_config"]``): its shape's fields and the runtime's knobs
GPT_SHAPE_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "bias", "name")
GPT_KNOBS = ("eps", "seed", "emb_std")


# ----------------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------------
class StudyText:
    """The three disjoint parts of the token stream ``[T]``: ``passages [N, P+C]``, the other text, the held-out
    text; ``batch(step)`` is the step's global batch (a function of the seed and the step)."""

    def __init__(self, tokens: torch.Tensor, n: int, prompt: int, continuation: int, heldout_frac: float,
                 batch: int, other: int, seed: int, heldout: Optional[torch.Tensor] = None) -> None:
        length = prompt + continuation
        cut = int(tokens.numel() * (1.0 - heldout_frac)) if heldout is None else tokens.numel()
        self.passages = tokens[: n * length].view(n, length)
        self.other = TokenWindows(tokens[n * length: cut], length - 1, seed, "the other text")
        self.heldout = tokens[cut:] if heldout is None else heldout
        self.n, self.prompt, self.continuation, self.seed = n, prompt, continuation, seed
        self.per_step = batch - other
        self.other_per_step = other

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.per_step

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs [B, P+C-1], targets [B, P+C-1])``: this step's passages, then windows of the other text."""
        epoch, i = divmod(step, self.steps_per_epoch)
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
        rows = self.passages[order[i * self.per_step: (i + 1) * self.per_step]]
        inputs, targets = rows[:, :-1], rows[:, 1:]
        if self.other_per_step:
            x, y = self.other.batch(step, self.other_per_step)
            inputs, targets = torch.cat([inputs, x]), torch.cat([targets, y])
        return inputs, targets

    def heldout_windows(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` evenly spaced windows of the held-out text (fixed: the same for every run and evaluation)."""
        seq = self.passages.shape[1] - 1
        starts = torch.linspace(0, self.heldout.numel() - seq - 1, count).long().tolist()
        win = torch.stack([self.heldout[s: s + seq + 1] for s in starts])
        return win[:, :-1], win[:, 1:]


# ----------------------------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------------------------
def continuations(model: torch.nn.Module, grid: axgrid.Grid, prompts: torch.Tensor, length: int) -> torch.Tensor:
    """The greedy continuations ``[N, length]`` of ``prompts [N, P]`` (``axgrid.generate``)."""
    out = axgrid.generate(model, prompts.to(grid.device), grid, length)
    return out[:, prompts.shape[1]:].cpu()


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, grid: axgrid.Grid, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean cross entropy per token on ``inputs/targets [H, S]`` (H split over d; standard loss, no mask)."""
    gd, d = grid.size("d"), grid.coord.d
    per = inputs.shape[0] // gd
    rows = slice(d * per, (d + 1) * per)
    loss = causal_lm_loss(model, inputs[rows].to(grid.device), targets[rows].to(grid.device), None,
                          inputs[: per * gd].numel() / gd)
    return float(grid.comm.all_reduce(loss.detach().float().reshape(1), "d", average=True)[0])


def evaluate(model: torch.nn.Module, grid: axgrid.Grid, text: StudyText, heldout: tuple[torch.Tensor, torch.Tensor]
             ) -> dict[str, float]:
    """``exact_match``, ``token_accuracy``, ``rouge_l`` of the passages' continuations and ``heldout_loss``."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        gen = continuations(model, grid, text.passages[:, : text.prompt], text.continuation)
    scores = score_continuations(gen, text.passages[:, text.prompt:]).as_dict()
    scores["heldout_loss"] = heldout_loss(model, grid, *heldout)
    model.train(was_training)
    return scores


# ----------------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------------
def gpt_config(args: argparse.Namespace, seq: int) -> GPTConfig:
    over = {k: getattr(args, k) for k in ("layers", "hidden", "heads") if getattr(args, k) is not None}
    return GPTConfig.named(args.model, seq=seq, vocab=256, recompute=args.recompute, seed=args.seed, **over)


def build_model(args: argparse.Namespace, grid: axgrid.Grid, seq: int) -> torch.nn.Module:
    """A fresh model of the study: axgrid's GPT from its hashed initialisation, or the Hugging Face checkpoint."""
    if args.checkpoint:
        return load_causal_lm(args.checkpoint, grid, args.recompute)
    model = GPT(gpt_config(args, seq), grid)
    grid.watch(model)
    return model


def save_model(model: torch.nn.Module, directory: str, grid: axgrid.Grid, tokenizer: Optional[Any]) -> None:
    """A run's final model: an axgrid checkpoint (GPT; its GPTConfig in the manifest's ``extra``) or a Hugging
    Face folder."""
    if isinstance(model, GPT):
        from axgrid.checkpoint import save_checkpoint
        cfg = {**{k: getattr(model.config.shape, k) for k in GPT_SHAPE_FIELDS},
               **{k: getattr(model.config, k) for k in GPT_KNOBS}}
        save_checkpoint(directory, model, None, grid, step=0, extra={"gpt_config": cfg})
        return
    axgrid.export_pretrained(model, directory, grid, tokenizer=tokenizer)


def load_any(path: str, grid: axgrid.Grid) -> tuple[torch.nn.Module, Optional[Any]]:
    """The model at ``path`` (a Hugging Face folder, or an axgrid checkpoint of the study's GPT) and its tokenizer
    (None: byte-level)."""
    if os.path.isfile(os.path.join(path, "config.json")):
        return load_causal_lm(path, grid), load_tokenizer(path)
    from axgrid.checkpoint import CheckpointError, load_checkpoint, verify_checkpoint
    try:
        saved = verify_checkpoint(path)["extra"]["gpt_config"]
        cfg = GPTConfig(TransformerShape(**{k: v for k, v in saved.items() if k in GPT_SHAPE_FIELDS}),
                        **{k: v for k, v in saved.items() if k in GPT_KNOBS})
    except (CheckpointError, KeyError, TypeError, OSError) as e:
        raise SystemExit(f"--eval-only {path}: neither a Hugging Face folder (config.json) nor an axgrid checkpoint "
                         f"of the study's GPT ({e})") from None
    model = GPT(cfg, grid)
    load_checkpoint(path, model, None, grid)
    return model, None


# ----------------------------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for memorization.json, curves.json, the PNG, models")
    p.add_argument("--text-file", default=str(DEFAULT_TEXT))
    p.add_argument("--passages", type=int, help="N passages memorized (32; 16 with --checkpoint)")
    p.add_argument("--prompt", type=int, default=32, help="P prompt tokens")
    p.add_argument("--continuation", type=int, default=32, help="C tokens decoded and scored")
    p.add_argument("--epochs", type=int, help="E passes over the passages (120; 12 with --checkpoint)")
    p.add_argument("--eval-every", type=int, help="evaluate every K epochs and at the end (20; 3)")
    p.add_argument("--other", type=int, help="of the --batch sequences per step, windows of the other text (8; 0)")
    p.add_argument("--heldout", type=int, help="held-out windows scored (64; 16)")
    p.add_argument("--heldout-frac", type=float, default=0.1, help="last fraction of the text: held out")
    p.add_argument("--losses", default="standard,goldfish", help="runs, of: standard, goldfish")
    p.add_argument("--model", default="gpt-mini", help="axgrid GPT size (axgrid.spec NAMED_SIZES)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--checkpoint", default=None, help="fine-tune this Hugging Face folder instead of a fresh GPT")
    p.add_argument("--eval-only", default=None, metavar="CHECKPOINT", help="only measure this model")
    p.add_argument("--grid", default=None, help="GXxGYxGZxGD (default 1x1x1xWORLD)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=axgrid.RuntimeConfig.timeout_s)
    add_data_arguments(p, evaluation=False)
    add_step_arguments(p)          # the step's options, as the other drivers have them; the study's defaults
    # (batch 24, lr 4e-3, warm-up 10; with --checkpoint batch 16, lr 3e-4, warm-up 1):
    p.set_defaults(goldfish_k=4, weight_decay=0.0, **DEFAULTS[study_kind(argv)])
    args = parse_step_args(p, argv)
    args.loss_list = [s for s in args.losses.split(",") if s]
    return args


def study_kind(argv: Optional[Sequence[str]]) -> str:
    """``"pretrained"`` when ``argv`` names a Hugging Face model to train (``--checkpoint``) or to measure
    (``--eval-only`` of a folder with a config.json), else ``"scratch"``: the key of :data:`DEFAULTS`."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--checkpoint")
    pre.add_argument("--eval-only")
    usage_errors_raise(pre)
    known, _ = pre.parse_known_args(list(argv) if argv is not None else None)
    hf_eval = known.eval_only and os.path.isfile(os.path.join(known.eval_only, "config.json"))
    return "pretrained" if known.checkpoint or hf_eval else "scratch"


def check_args(args: argparse.Namespace) -> None:
    """Problems visible without the grid, raised identically on every rank before any collective."""
    bad = [s for s in args.loss_list if s not in LOSSES] or (None if args.loss_list else ["(none)"])
    if bad:
        raise SystemExit(f"--losses {args.losses}: {bad} not among {list(LOSSES)}; e.g. --losses standard,goldfish")
    for name in ("passages", "prompt", "continuation", "epochs", "eval_every", "batch", "heldout"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if not 0 <= args.other < args.batch:
        raise SystemExit(f"--other {args.other}: the other-text windows must be fewer than --batch {args.batch}")
    if not args.eval_only and args.passages % (args.batch - args.other):
        raise SystemExit(f"--passages {args.passages} is not a whole number of steps of {args.batch - args.other} "
                         f"passages (--batch {args.batch} - --other {args.other}); make it a multiple")
    if not 0 < args.heldout_frac < 0.5:
        raise SystemExit(f"--heldout-frac {args.heldout_frac}: must be in (0, 0.5)")
    if "goldfish" in args.loss_list and args.goldfish_k < 2:
        raise SystemExit(f"--goldfish-k {args.goldfish_k}: the goldfish run needs K >= 2")
    if not args.data_path and not os.path.isfile(args.text_file):
        raise SystemExit(f"--text-file {args.text_file} does not exist or is not a file")
    check_data_arguments(args)
    if not args.eval_only:
        check_step_arguments(args, args.epochs * (args.passages // (args.batch - args.other)))
    check_output_paths({"--out": args.out})
    for flag, path in (("--checkpoint", args.checkpoint), ("--eval-only", args.eval_only)):
        if path and not os.path.isdir(path):
            raise SystemExit(f"{flag} {path} is not a folder")


# ----------------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the study (or ``--eval-only``); returns what memorization.json holds, on every rank."""
    args = parse_args(argv)
    check_args(args)
    dtype = compute_dtype(args.dtype)
    grid = axgrid.init(args.grid or "1x1x1", config=axgrid.RuntimeConfig(timeout_s=args.timeout, seed=args.seed))
    try:
        return _study(args, grid, dtype)
    finally:
        grid.destroy()


def _text(args: argparse.Namespace, tokenizer: Optional[Any]) -> StudyText:
    need = args.passages * (args.prompt + args.continuation)
    if args.data_path:
        return _corpus_text(args, need)
    tokens = encode(Path(args.text_file).read_text(encoding="utf-8"), tokenizer)
    if tokens.numel() * (1 - args.heldout_frac) < need + 4 * (args.prompt + args.continuation):
        raise SystemExit(f"--text-file {args.text_file} has {tokens.numel()} tokens: too few for {args.passages} "
                         f"passages of {args.prompt + args.continuation} tokens plus other and held-out text")
    return StudyText(tokens, args.passages, args.prompt, args.continuation, args.heldout_frac, args.batch,
                     args.other, args.seed)


def _corpus_text(args: argparse.Namespace, need: int) -> StudyText:
    """Passages and other text from the train split (as much as the study can use), held-out windows from the
    validation split (``--heldout`` windows back to back)."""
    length = args.prompt + args.continuation
    steps = args.epochs * (args.passages // max(args.batch - args.other, 1))
    try:
        train = split_tokens(data_settings(args), "train", need + (steps * args.other + 4) * length)
        heldout = split_tokens(data_settings(args), "valid", args.heldout * length + 1)
    except DataError as e:
        raise SystemExit(str(e)) from None
    top = max(int(train.max()), int(heldout.max()))
    if not args.checkpoint and top >= 256:
        raise SystemExit(f"--data-path: token id {top} >= the study GPT's vocabulary 256: preprocess with "
                         f"--tokenizer bytes, or pass --checkpoint with the corpus' tokenizer")
    if train.size < need + 4 * length or heldout.size < length + 1:
        raise SystemExit(f"--data-path: the train split has {train.size} tokens and the validation split "
                         f"{heldout.size}: too few for {args.passages} passages of {length} tokens plus other and "
                         f"held-out text")
    return StudyText(torch.from_numpy(train), args.passages, args.prompt, args.continuation, args.heldout_frac,
                     args.batch, args.other, args.seed, heldout=torch.from_numpy(heldout))


def _study(args: argparse.Namespace, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    rank0 = grid.rank == 0
    t_start = time.perf_counter()
    length = args.prompt + args.continuation
    split = grid.size("d") * grid.size("z")
    if args.heldout % split:
        raise SystemExit(f"--heldout {args.heldout} is not divisible by Gd*Gz = {split} of grid {grid.shape}")
    if args.eval_only:
        model, tokenizer = load_any(args.eval_only, grid)
        text = _text(args, tokenizer)
        scores = evaluate(model, grid, text, text.heldout_windows(args.heldout))
        result = {"eval_only": scores, "settings": _settings(args, grid, dtype, text, time.perf_counter() - t_start)}
        _write(args.out, result, None, grid)
        if rank0:
            print(_table({args.eval_only: scores}), flush=True)
        return result
    tokenizer = load_tokenizer(args.checkpoint) if args.checkpoint else None
    text = _text(args, tokenizer)
    heldout = text.heldout_windows(args.heldout)
    steps = args.epochs * text.steps_per_epoch
    StepSettings.from_args(args, steps, dtype).check(grid)
    result: dict[str, Any] = {}
    curves: dict[str, list[dict[str, float]]] = {}
    initial: Optional[dict[str, float]] = None
    for loss in args.loss_list:
        t0 = time.perf_counter()
        settings = StepSettings.from_args(args, steps, dtype, goldfish=loss == "goldfish")
        model = build_model(args, grid, length - 1)
        opt = axgrid.adamw(decay_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, args.beta2))
        flops = (model.flops_per_iteration(args.batch) if isinstance(model, GPT)
                 else llama_flops(model.config, args.batch, length - 1, args.recompute))
        os.makedirs(args.out, exist_ok=True)
        metrics = Metrics(grid, flops_per_step=flops, tokens_per_step=args.batch * (length - 1), dtype=dtype,
                          jsonl=os.path.join(args.out, f"{loss}.jsonl"), config={"study": loss, "steps": steps})
        if initial is None:             # every run starts from the same weights: scored once, shared
            initial = evaluate(model, grid, text, heldout)
        curve = [{"epoch": 0, **initial}]
        for epoch in range(1, args.epochs + 1):
            for i in range(text.steps_per_epoch):
                step = (epoch - 1) * text.steps_per_epoch + i
                rec = run_step(model, opt, grid, settings, step, *text.batch(step), metrics)
            if epoch % args.eval_every == 0 or epoch == args.epochs:
                curve.append({"epoch": epoch, "train_loss": rec["loss"], **evaluate(model, grid, text, heldout)})
                if rank0:
                    c = curve[-1]
                    print(f"memorization: {loss} epoch {epoch}/{args.epochs}: train loss {c['train_loss']:.3f}, "
                          f"exact {c['exact_match']:.2f}, token acc {c['token_accuracy']:.2f}, ROUGE-L "
                          f"{c['rouge_l']:.2f}, held-out loss {c['heldout_loss']:.3f} "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
        metrics.close()
        save_model(model, os.path.join(args.out, loss), grid, tokenizer)
        final = curve[-1]
        result[loss] = {k: final[k] for k in ("exact_match", "token_accuracy", "rouge_l", "heldout_loss")}
        result[loss]["epochs_to_80"] = epochs_to(curve, MEMORIZED)
        curves[loss] = curve
    result["settings"] = _settings(args, grid, dtype, text, time.perf_counter() - t_start, steps)
    _write(args.out, result, curves, grid)
    if rank0:
        print(_table({k: v for k, v in result.items() if k != "settings"}), flush=True)
        print(f"memorization: wrote {os.path.join(args.out, 'memorization.json')} and memorization.png "
              f"({result['settings']['wall_s']:.0f} s)", flush=True)
    return result


def _settings(args: argparse.Namespace, grid: axgrid.Grid, dtype: str, text: StudyText, wall: float,
              steps: Optional[int] = None) -> dict[str, Any]:
    keep = ("text_file", "data_path", "split", "passages", "prompt", "continuation", "epochs", "eval_every", "batch", "other", "heldout",
            "heldout_frac", "losses", "goldfish_k", "goldfish_h", "goldfish_mode", "model", "layers", "hidden",
            "heads", "checkpoint", "eval_only", "microbatches", "lr", "min_lr", "warmup", "weight_decay", "beta2",
            "clip", "recompute", "seed")
    out = {k: getattr(args, k) for k in keep}
    if not args.checkpoint and not args.eval_only:
        cfg = gpt_config(args, args.prompt + args.continuation - 1)
        m = cfg.shape
        out.update(layers=m.layers, hidden=m.hidden, heads=m.heads, parameters=m.params)
    out.update(grid=str(grid.shape), world=grid.world_size, dtype=dtype, steps=steps,
               steps_per_epoch=text.steps_per_epoch, wall_s=wall)
    return out


def epochs_to(curve: list[dict[str, float]], fraction: float) -> Optional[int]:
    """The first evaluated epoch whose exact-match rate is at least ``fraction`` (None: none is)."""
    return next((int(c["epoch"]) for c in curve if c["exact_match"] >= fraction), None)


def _table(rows: dict[str, dict[str, float]]) -> str:
    head = (f"{'run':<12} {'exact match':>11} {'token acc':>9} {'ROUGE-L':>7} {'held-out loss':>13} "
            f"{'epochs to 80%':>13}")
    lines = [head, "-" * len(head)]
    for name, s in rows.items():
        first = s.get("epochs_to_80", "")
        lines.append(f"{name:<12} {s['exact_match']:>11.3f} {s['token_accuracy']:>9.3f} {s['rouge_l']:>7.3f} "
                     f"{s['heldout_loss']:>13.4f} {'never' if first is None else first:>13}")
    return "\n".join(lines)


def _write(out: str, result: dict[str, Any], curves: Optional[dict[str, list]], grid: axgrid.Grid) -> None:
    """memorization.json and the table (memorization.txt); after a study also curves.json and memorization.png;
    by rank 0."""
    if grid.rank != 0:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "memorization.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "memorization.txt"), "w") as f:
        f.write(_table({k: v for k, v in result.items() if k != "settings"}) + "\n")
    if curves is None:
        return
    with open(os.path.join(out, "curves.json"), "w") as f:
        json.dump(curves, f, indent=1)
    plot(curves, result["settings"], os.path.join(out, "memorization.png"))


def plot(curves: dict[str, list[dict[str, float]]], settings: dict[str, Any], path: str) -> None:
    """Exact match and ROUGE-L against epochs (left) and held-out loss (right), one colour per loss."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    colours = {"standard": "tab:red", "goldfish": "tab:blue"}
    for loss, curve in curves.items():
        ep = [c["epoch"] for c in curve]
        label = loss if loss == "standard" else f"goldfish k={settings['goldfish_k']} ({settings['goldfish_mode']})"
        ax.plot(ep, [c["exact_match"] for c in curve], "o-", color=colours.get(loss), label=f"{label}: exact match")
        ax.plot(ep, [c["rouge_l"] for c in curve], "--", color=colours.get(loss), label=f"{label}: ROUGE-L")
        bx.plot(ep, [c["heldout_loss"] for c in curve], "o-", color=colours.get(loss), label=label)
    ax.set(xlabel="epoch", ylabel="fraction of passages / ROUGE-L", ylim=(-0.03, 1.03),
           title=f"{settings['passages']} passages, prompt {settings['prompt']}, "
                 f"continuation {settings['continuation']}")
    bx.set(xlabel="epoch", ylabel="held-out loss (nats/token)", title="held-out text (never trained on)")
    ax.legend(fontsize=7)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    run(main, "memorization")     # errors said once, as one line (axgrid.launch.errors)
