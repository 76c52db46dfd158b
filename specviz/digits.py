"""Numbers as the page and the reports print them: digits that never contradict a verdict."""

from __future__ import annotations

import math


def sig3(x: float) -> str:
    """x to three significant digits without an exponent, whole from 100 up: a CPU's 153 ms and
    a GPU's 1.4 ms or 0.04 ms both read as the hand figure (1234.6 -> '1,235', 0.0400 -> '0.04')."""
    # log10 of the float just below 100 rounds to 2.0: no decimals, and rstrip("0") read "100" as "1";
    # inf and NaN have no log10 digit count (floor raised): they print as Python writes them
    decimals = 2 - math.floor(math.log10(abs(x))) if x and math.isfinite(x) else 0
    if decimals <= 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{decimals}f}".rstrip("0").rstrip(".")


def beside(value: float, bar: float | tuple[float, ...], digits: int = 2, style: str = "f") -> str:
    """value printed with `digits` (decimals for style "f", significant digits for "g"), or more
    where fewer would round it onto or across a verdict's bar (or any of several bars): against a
    goal of >= 1.10, 1.0996 prints 1.0996, not a failing "1.10"; against p < 0.001, 0.0009996
    prints 0.0009996."""
    # a bar the value equals is no verdict on it (tree and chain both 5/3 a pass, each the other's bar)
    bars = tuple(b for b in (bar if isinstance(bar, tuple) else (bar,)) if b != value)
    for d in range(digits, digits + 8):
        text = f"{value:.{d}{style}}"
        shown = float(text)
        if shown == value or all(shown != b and (shown > b) == (value > b) for b in bars):
            return text
    return repr(value)


def percent(share: float, decimals: int = 1) -> str:
    """A share in 0..1 as a percentage with `decimals`, or more where fewer would round it onto
    0% or 100% (249 of 250 kept prints 99.6%, not a 100% that says nothing was refused)."""
    value = 100 * share
    text = beside(value, 100.0, decimals)
    return (beside(value, 0.0, decimals) if float(text) == 0 else text) + "%"


def share(value: float) -> str:
    """A probability to 4 decimals, or more where 4 would print a nonzero one as 0.0000 or one
    below 1 as 1.0000 (a drafted token with p(x) = 2e-5 read p(x)=0.0000 beside an accept
    probability of 0.0001)."""
    return beside(float(value), (0.0, 1.0), 4)
