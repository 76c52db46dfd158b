"""Speculative output against the baseline's: identical, or where and why not."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .metrics import RunStats

# Running k+1 positions in one pass reorders the floating-point sums behind each logit, which
# moves it by a few units in the last place (ulp) of the model's dtype. A top-2 margin within
# NEAR_TIE_ULPS such units is a near-tie that this alone can flip; a wider one is unexplained.
NEAR_TIE_ULPS = 8
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of dtype's numbers around value."""
    exponent = math.floor(math.log2(max(abs(value), 1e-30)))
    return 2.0 ** (exponent - _MANTISSA_BITS.get(dtype, 23))


def top2_at(stats: RunStats, position: int) -> list[tuple[int, float]] | None:
    """The target's top-2 (id, logit) where it chose output token `position` in this run.

    Read from the round that committed that token: its row j was computed on the committed
    context (the drafts before j were all kept). An earlier round's window may cover the same
    position, but on a context that held a refused draft."""
    for e in stats.events:
        if e.position <= position < e.position + len(e.new_tokens):
            j = position - e.position  # <= e.accepted
            return e.target_top2[j] if j < len(e.target_top2) else None
    return None


@dataclass(frozen=True)
class Comparison:
    identical: bool
    position: int | None = None  # first differing output position (0-based)
    spec_top2: list[tuple[int, float]] | None = None
    base_top2: list[tuple[int, float]] | None = None
    dtype: str = ""
    device: str = ""
    threshold: float | None = 0.0  # near-tie margin bound in logits at this position; None
    # where neither run recorded its top-2 there (older traces): no logit to scale it by
    numerics: str = ""  # what was compared, in words (Pair.numerics)

    @staticmethod
    def margin(top2) -> float | None:
        return None if not top2 else top2[0][1] - top2[1][1]

    @property
    def near_tie(self) -> bool:
        """Every recorded run's margin is within the bound: rounding moves each logit a few ulps,
        so it flips a choice only where both runs sit at the tie. One run near it and the other 3.0
        apart (24 bf16 ulps at 20) is a move no reordered sum makes."""
        margins = [m for m in (self.margin(self.spec_top2), self.margin(self.base_top2)) if m is not None]
        return bool(margins) and self.threshold is not None and max(margins) <= self.threshold

    @property
    def verdict(self) -> str:
        if self.identical:
            return "identical"
        if self.near_tie:
            return "near-tie flipped by floating point"
        if self.threshold is None:
            return "cannot tell: neither run recorded the target's top-2 logits there"
        return "unexplained: please report"


def compare(spec: RunStats, base: RunStats, dtype: torch.dtype, device: str,
            numerics: str = "") -> Comparison:
    pos = first_difference(spec.tokens, base.tokens)
    if pos is None:
        return Comparison(True, dtype=str(dtype).removeprefix("torch."), device=str(device),
                          numerics=numerics)
    return parted(pos, top2_at(spec, pos), top2_at(base, pos), dtype, device, numerics)


def parted(pos: int, spec_top2, base_top2, dtype: torch.dtype, device: str, numerics: str = "") -> Comparison:
    """Runs that differ from output token pos, with each one's top-2 there (None: not recorded):
    the near-tie bound scales with the larger top logit of the two."""
    recorded = [t for t in (spec_top2, base_top2) if t]
    threshold = NEAR_TIE_ULPS * ulp(max(abs(t[0][1]) for t in recorded), dtype) if recorded else None
    return Comparison(False, pos, spec_top2, base_top2, str(dtype).removeprefix("torch."), str(device),
                      threshold, numerics)
