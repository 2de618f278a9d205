"""GemmTuner: run every GEMM of a layer with the fastest layout/order, decided once and remembered.

Usage (inside an autograd Function, on tensors that do not require grad)::

    tuner = GemmTuner(mode="on-first-use")
    y  = tuner(x, w_blk.t(), "forward")        # x [m', k], w_blk [n, k]   -> y  [m', n]
    dx = tuner(dy, w_blk, "input_grad")        # dy [m', n]                -> dx [m', k]
    dw = tuner(dy.t(), x, "weight_grad")       #                           -> dw [n, k]
"""
from __future__ import annotations

import collections
import datetime
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import candidates as cands
from .agree import Agreement, agree_on, torch_group_agreement
from .cache import GemmCache
from .signature import ROLE_INPUT_LAYOUTS, GemmSignature, check_operands, check_role, layout_of
from .timing import measure
from .validators import current_validators

MODES: tuple[str, ...] = ("on-first-use", "cache-only", "off")


@dataclass
class TunerStats:
    """Counters a test or a log can read: which candidate ran how often, and where decisions came from."""

    calls: collections.Counter = field(default_factory=collections.Counter)  # candidate name -> calls
    tuned: int = 0          # signatures timed in this process
    cache_hits: int = 0     # decisions taken from a valid cache entry
    cache_stale: int = 0    # cache entries rejected because validators differ
    cache_misses: int = 0   # cache-only lookups that found nothing (default used)
    unconfirmed: int = 0    # tentative winners that did not beat the default again on fresh samples (or no time)
    rejected: int = 0       # tuned winners that failed the numerical check (default kept)
    layout_mismatch: int = 0  # calls whose operand layouts differ from the role's usual ones


def pick_winner(median_s: dict[str, float], margin: float) -> str:
    """The fastest candidate if it beats ``default`` by more than ``margin`` (fraction), else 'default'."""
    others = {k: v for k, v in median_s.items() if k != cands.DEFAULT}
    if not others:
        return cands.DEFAULT
    best = min(others, key=others.__getitem__)
    return best if others[best] < median_s[cands.DEFAULT] * (1.0 - margin) else cands.DEFAULT


def _tolerance(dtype: torch.dtype, k: int) -> tuple[float, float]:
    """(rtol, atol) for comparing two evaluations of a k-term dot product in ``dtype``."""
    eps = torch.finfo(dtype).eps
    return 16 * eps, 4 * eps * max(k, 1) ** 0.5


def synthetic_operands(sig: GemmSignature, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random a [m, k], b [k, n] laid out as the role hands them over (does not touch the global RNG)."""
    gen = torch.Generator(device=device).manual_seed(0)
    dt = sig.torch_dtype

    def make(rows: int, cols: int, layout: str) -> torch.Tensor:
        shape = (rows, cols) if layout == "N" else (cols, rows)
        t = torch.randn(shape, generator=gen, device=device, dtype=dt)
        return t if layout == "N" else t.t()

    la, lb = ROLE_INPUT_LAYOUTS[sig.role]
    return make(sig.m, sig.k, la), make(sig.k, sig.n, lb)


class GemmTuner:
    """Callable ``tuner(a, b, role) -> a @ b`` using the tuned candidate for the GEMM's signature.

    mode: "on-first-use" (tune unknown signatures when first seen, persist them), "cache-only"
      (use valid cache entries, else plain torch.matmul; never times anything), "off" (plain torch.matmul).
    cache_path: decision file; None = $AXGRID_GEMM_CACHE or ~/.cache/axgrid/gemm.json (XDG_CACHE_HOME honoured).
    margin: a candidate replaces the default only when its median time is lower by more than this fraction.
    max_tune_seconds: cap on the wall time spent timing one signature (warm-up and confirmation included; it is
      overrun by at most the GEMM call running when it expires, plus the numerical check of a winner).
      Candidates it leaves untimed are listed in the entry's ``untimed``.
    warmup, repeats: untimed and timed rounds (each round runs every candidate once).
    group: None, a torch.distributed ProcessGroup, or a ``kernels.Agreement``; with one, the group's
      source rank decides each signature and broadcasts it, so all ranks of the group use the same
      candidate (every rank must then make the same sequence of first calls).
    """

    def __init__(self, mode: str = "on-first-use", cache_path: str | os.PathLike | None = None, margin: float = 0.03,
                 max_tune_seconds: float = 5.0, warmup: int = 5, repeats: int = 20, group: Any = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown GemmTuner mode {mode!r}; use one of {MODES}")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin={margin!r} must be a fraction in [0, 1), e.g. 0.03 for 3%")
        if max_tune_seconds <= 0 or warmup < 0 or repeats < 1:
            raise ValueError(f"need max_tune_seconds > 0, warmup >= 0, repeats >= 1; "
                             f"got {max_tune_seconds!r}, {warmup!r}, {repeats!r}")
        self.mode, self.margin = mode, float(margin)
        self.max_tune_seconds, self.warmup, self.repeats = float(max_tune_seconds), int(warmup), int(repeats)
        self.cache = GemmCache(cache_path)
        self.agreement: Agreement | None = (group if isinstance(group, Agreement) or group is None
                                            else torch_group_agreement(group))
        self.stats = TunerStats()
        self._decided: dict[tuple[str, str], cands.Candidate] = {}  # (signature key, device str) -> decision
        self._disk: dict[str, dict] | None = None

    # ------------------------------------------------------------------ public
    def __call__(self, a: torch.Tensor, b: torch.Tensor, role: str) -> torch.Tensor:
        """a [m, k] @ b [k, n] -> contiguous [m, n], via the signature's chosen candidate."""
        check_operands(a, b)
        check_role(role)
        if self.mode == "off":
            self.stats.calls[cands.DEFAULT] += 1
            return torch.matmul(a, b)
        sig = GemmSignature.of(a, b, role)
        if (layout_of(a), layout_of(b)) != ROLE_INPUT_LAYOUTS[role]:
            self.stats.layout_mismatch += 1
        cand = self._decide(sig, a.device, a, b)
        self.stats.calls[cand.name] += 1
        needs_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
        if needs_grad and cand.backend == "cupy":  # keep autograd intact: same layout/order through torch
            cand = cands.Candidate("torch", cand.layout, cand.order)
        if needs_grad:
            return cands.run(cand, a, b)
        with torch.no_grad():
            return cands.run(cand, a, b)

    def choice(self, m: int, n: int, k: int, dtype: str | torch.dtype, device: str | torch.device,
               role: str) -> str:
        """Name of the candidate used for this signature ('default', 'torch:NT:AB', ...).

        Decides it exactly as a call would (so in "on-first-use" mode an unknown signature is tuned
        now, on synthetic operands laid out as the role passes them).
        """
        sig = GemmSignature.make(m, n, k, dtype, device, role)
        if self.mode == "off":
            return cands.DEFAULT
        return self._decide(sig, torch.device(device)).name

    def tune(self, m: int, n: int, k: int, dtype: str | torch.dtype, device: str | torch.device,
             role: str, force: bool = False) -> dict:
        """Time all candidates for the signature now (unless a valid entry exists and not ``force``); return the entry."""
        sig = GemmSignature.make(m, n, k, dtype, device, role)
        dev = torch.device(device)
        entry = None if force else self._valid_entry(sig, dev)
        if entry is None:
            entry = self._tune(sig, dev)
        else:
            self.stats.cache_hits += 1
        self._decided[(sig.key, str(dev))] = cands.Candidate.parse(entry["winner"])
        return entry

    def entries(self) -> dict[str, dict]:
        """Snapshot of the cache file's entries."""
        return self.cache.load()

    # ----------------------------------------------------------------- helpers
    def _decide(self, sig: GemmSignature, device: torch.device, a: torch.Tensor | None = None,
                b: torch.Tensor | None = None) -> cands.Candidate:
        slot = (sig.key, str(device))
        if slot not in self._decided:
            decide = lambda: self._decide_here(sig, device, a, b)  # noqa: E731
            name = decide() if self.agreement is None else agree_on(decide, self.agreement)
            if not isinstance(name, str):
                raise RuntimeError(f"GEMM agreement broadcast returned {name!r}, expected a candidate name; "
                                   "check the group's broadcast_object and src")
            cand = cands.Candidate.parse(name)
            if cand.backend == "cupy" and not cands.cupy_usable(sig):  # another rank had cupy; same math via torch
                cand = cands.Candidate("torch", cand.layout, cand.order)
            self._decided[slot] = cand
        return self._decided[slot]

    def _decide_here(self, sig: GemmSignature, device: torch.device, a: torch.Tensor | None,
                     b: torch.Tensor | None) -> str:
        entry = self._valid_entry(sig, device)
        if entry is not None:
            self.stats.cache_hits += 1
            return entry["winner"]
        if self.mode == "cache-only":
            self.stats.cache_misses += 1
            return cands.DEFAULT
        return self._tune(sig, device, a, b)["winner"]

    def _valid_entry(self, sig: GemmSignature, device: torch.device) -> dict | None:
        if self._disk is None or sig.key not in self._disk:
            self._disk = self.cache.load()  # another process may have tuned it meanwhile
        entry = self._disk.get(sig.key)
        if entry is None:
            return None
        try:
            cands.Candidate.parse(entry["winner"])
        except ValueError:
            return None
        if entry.get("validators") != current_validators(device):
            self.stats.cache_stale += 1
            return None
        return entry

    def _tune(self, sig: GemmSignature, device: torch.device, a: torch.Tensor | None = None,
              b: torch.Tensor | None = None) -> dict:
        if a is None or b is None:
            a, b = synthetic_operands(sig, device)
        fns = {c.name: (lambda c=c: cands.run(c, a, b)) for c in cands.candidates_for(sig)}
        deadline = time.perf_counter() + self.max_tune_seconds
        confirm_s: dict[str, float] = {}
        with torch.no_grad():
            meas = measure(fns, device, self.warmup, self.repeats, 0.75 * self.max_tune_seconds)
            untimed = sorted(set(fns) - set(meas.median_s))      # the budget ran out first (big GEMMs)
            winner = pick_winner(meas.median_s, self.margin)
            if winner != cands.DEFAULT:
                # The fastest of many noisy medians is biased low: the default must lose again, on fresh samples,
                # within what is left of the budget (none left: the default stays).
                pair = {cands.DEFAULT: fns[cands.DEFAULT], winner: fns[winner]}
                left = deadline - time.perf_counter()
                confirm_s = measure(pair, device, 1, self.repeats, left).median_s if left > 0 else {}
                if set(confirm_s) != set(pair) or pick_winner(confirm_s, self.margin) != winner:
                    self.stats.unconfirmed += 1
                    winner = cands.DEFAULT
            if winner != cands.DEFAULT:
                ref, out = fns[cands.DEFAULT](), fns[winner]()
                rtol, atol = _tolerance(a.dtype, sig.k)
                if not torch.allclose(out.float(), ref.float(), rtol=rtol, atol=atol * float(ref.abs().max())):
                    self.stats.rejected += 1
                    winner = cands.DEFAULT
        entry = {"m": sig.m, "n": sig.n, "k": sig.k, "dtype": sig.dtype, "device": sig.device, "role": sig.role,
                 "winner": winner, "times_s": meas.median_s, "rounds": meas.rounds, "margin": self.margin,
                 "confirm_s": confirm_s, "untimed": untimed,
                 "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "validators": current_validators(device)}
        self.stats.tuned += 1
        if self._disk is not None:
            self._disk[sig.key] = entry
        self.cache.put(sig, entry)
        return entry
