"""What one more verified token costs: the target pass's seconds against the drafted tokens it
verifies, T(n) = a + b * n, fitted to the rounds a run has measured. Every drafter that sizes its
drafts (the adaptive chain, the token tree) prices a token by this line rather than by an assumed
slope: on a GPU verification is nearly flat up to dozens of tokens, on a CPU without bf16 matrix
hardware one more token costs about half a one-token pass. One line is kept per target model
(`VerifyCost.of`), so a pair's later runs start from what its earlier runs measured.
"""

from __future__ import annotations

import weakref
from collections import deque
from statistics import fmean

# The prior for b / a until a run has measured the line: one more verified token as a fraction of
# a one-token target pass (0.034 measured with `python -m specviz costs` on a CPU with bf16
# matrix hardware; about 0.04 on a GPU).
VERIFY_SLOPE = 0.04


def fit_line(xs: list[float], ts: list[float]) -> tuple[float, float] | None:
    """(a, b): least squares of t = a + b x, b clipped at 0; None when the xs have no spread or
    the intercept is not positive (the line then says nothing about a pass's cost)."""
    mx, mt = fmean(xs), fmean(ts)
    var = fmean([(x - mx) ** 2 for x in xs])
    if var <= 0:
        return None
    b = max(0.0, fmean([(x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)]) / var)
    a = mt - b * mx
    return (a, b) if a > 0 else None


MIN_ROUNDS, MIN_SPREAD = 3, 4  # a line needs this many rounds at each end of this span of sizes


def spans_widths(ns: list[float], rounds: int = MIN_ROUNDS, spread: int = MIN_SPREAD) -> bool:
    """Enough rounds at both ends to fit a line: sizes spanning `spread`, with at least `rounds`
    of them in each half of that span. A line through one round at one end is that round's noise;
    a baseline's many one-token rounds after a chain's few verify rounds must not fit one."""
    if not ns or max(ns) - min(ns) < spread:
        return False
    mid = (max(ns) + min(ns)) / 2
    high = sum(n > mid for n in ns)
    return high >= rounds and len(ns) - high >= rounds


def fit_spread(ns: list[float], ts: list[float]) -> tuple[float, float] | None:
    """fit_line(ns, ts) where the sizes ns span enough to say anything (spans_widths), else None."""
    return fit_line(ns, ts) if spans_widths(ns) else None


class VerifyCost:
    """Target seconds per round against the drafted tokens it verified (a chain's k, a tree's
    nodes), T(n) = a + b * n: least squares over the last WINDOW rounds. Until the window holds
    MIN_ROUNDS rounds at each end of a span of MIN_SPREAD sizes (spans_widths: a line through a
    few noisy points can say anything), b = VERIFY_SLOPE * a. Once a slope is fitted it holds
    while the window lacks the spread (a drafter that learnt to draft short no longer varies its
    sizes; a baseline's rounds push a chain's out), with a re-estimated from the window.
    `of(target)` keeps one per target model across runs and drafters, so only a pair's first
    runs have to measure it."""

    WINDOW, MIN_ROUNDS, MIN_SPREAD = 32, MIN_ROUNDS, MIN_SPREAD

    def __init__(self, prior_slope: float = VERIFY_SLOPE):
        self.prior = prior_slope
        self.seen: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)
        self.fitted: float | None = None  # b / a of the last line the rounds fitted

    @classmethod
    def of(cls, target) -> VerifyCost:
        return _COSTS.setdefault(target, cls())

    @property
    def measured(self) -> bool:
        """The rounds have fitted a slope (now or earlier)."""
        return self.fitted is not None

    def _line(self) -> tuple[float, float] | None:
        """The window's own least-squares line, when its sizes spread enough to say anything."""
        return fit_spread([float(x) for x, _ in self.seen], [s for _, s in self.seen])

    def observe(self, nodes: int, seconds: float) -> None:
        self.seen.append((nodes, seconds))
        line = self._line()
        if line is not None:
            self.fitted = line[1] / line[0]

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds: a pass over the context's last token alone, and one more node;
        None before any round, or while every round measured no time."""
        if not self.seen:
            return None
        line = self._line()
        if line is not None:
            return line
        slope = self.prior if self.fitted is None else self.fitted
        a = fmean(s for _, s in self.seen) / (1 + slope * fmean(x for x, _ in self.seen))
        return (a, slope * a) if a > 0 else None

    def slope(self) -> float:
        """b / a: one more verified node as a fraction of a one-token pass."""
        fit = self.fit()
        return self.prior if fit is None else fit[1] / fit[0]


_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target model -> VerifyCost
