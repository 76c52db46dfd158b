"""What one more verified token costs: the target pass's seconds against the drafted tokens it
verifies, in two pieces (T(0) = a; T(n) = a + s + b * n for n >= 1 drafts), fitted to the rounds
the runs have measured. Every drafter that sizes its drafts (the adaptive chain, the token tree,
the n-gram rule) prices a token by this line rather than by an assumed slope: on a GPU
verification is nearly flat up to dozens of tokens, on a CPU without bf16 matrix hardware one
more token costs about half a one-token pass, and in float32 on oneDNN the first drafted token
costs most of a pass and each further one 4-6%. One line is kept per target model
(`VerifyCost.of`), so a pair's later runs start from what its earlier runs measured.
"""

from __future__ import annotations

import contextlib
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


def split_step(line: tuple[float, float], one_token: float) -> tuple[float, float, float] | None:
    """(a, s, b) in seconds: a drafted rounds' line (its intercept a + s, its slope b) split at the
    one-token pass a, the step s at least 0; None where the one-token pass measured no time."""
    if one_token <= 0:
        return None
    return one_token, max(0.0, line[0] - one_token), line[1]


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


def fit_spread(ns: list[float], ts: list[float], spread: int = MIN_SPREAD) -> tuple[float, float] | None:
    """fit_line(ns, ts) where the sizes ns span enough to say anything (spans_widths), else None."""
    return fit_line(ns, ts) if spans_widths(ns, spread=spread) else None


class VerifyCost:
    """Target seconds per round against the drafted tokens it verified (a chain's k, a tree's
    nodes), in two pieces: T(0) = a, a pass over the context's last token alone, and
    T(n) = a + s + b * n for n >= 1 drafts. s is the step from a one-token pass to any wider one:
    on this CPU in float32 oneDNN leaves its one-row kernel (365 -> 640-700 ms), after which a
    token costs 13-22 ms. A straight line through the target alone's rounds (n = 0) and a chain's
    (n = k) cannot tell s from b: it prices every drafted token at (s + k b) / k, there 0.2 of a
    pass where one costs 0.05, and the first one at a quarter of what it costs.

    Kept as ratios to a, slope = b / a and step = s / a, over the last WINDOW rounds of each kind:
    - slope: least squares over the drafted rounds once their sizes span MIN_SPREAD with
      MIN_ROUNDS at each end (spans_widths; `pieced`); until then, a line through every round,
      the target alone's as n = 0, where those span (the step then counted as 0); until then the
      prior, b = VERIFY_SLOPE * a.
    - step: where rounds of both kinds are at hand and the slope is pieced, the drafted rounds'
      intercept (their line's, else their mean excess over b n) over the mean one-token pass,
      less one, at least 0; else as last measured (0 to start with).
    A fitted ratio holds while the windows lack what fitted it (a drafter that learnt to draft
    short no longer varies its sizes; a baseline's rounds carry no drafts); a is re-estimated
    from every round in the windows. `of(target)` keeps one per target model across runs and
    drafters, so only a pair's first runs have to measure it."""

    WINDOW, MIN_ROUNDS, MIN_SPREAD = 32, MIN_ROUNDS, MIN_SPREAD

    def __init__(self, prior_slope: float = VERIFY_SLOPE):
        self.prior = prior_slope
        self.drafted: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)  # (n >= 1, seconds)
        self.alone: deque[float] = deque(maxlen=self.WINDOW)  # seconds of rounds with no drafts
        self.fitted: float | None = None  # b / a of the last line the rounds fitted
        self.pieced = False  # that line came from the drafted rounds' own spread
        self.step = 0.0  # s / a
        self.rounds = 0  # drafted rounds observed in all
        self.paused = False  # rounds observed now are no samples of the line (unobserved)

    @classmethod
    def of(cls, target) -> VerifyCost:
        return _COSTS.setdefault(target, cls())

    @property
    def measured(self) -> bool:
        """The rounds have fitted a slope (now or earlier)."""
        return self.fitted is not None

    @contextlib.contextmanager
    def unobserved(self):
        """Within, observe() takes no sample: the engine's round whose target pass compiled or
        captured a shape new to it (0.1-0.5 s a capture on the H200, against 3 ms a pass), which
        no later round of that size pays. Taken as a sample, one such round could push the
        line's intercept below 0 (no line fits), leaving the drafters and the n-gram rule a step
        of several passes for the window's next rounds."""
        before, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = before

    def observe(self, nodes: int, seconds: float) -> None:
        if self.paused:
            return
        if nodes:
            self.drafted.append((nodes, seconds))
            self.rounds += 1
        else:
            self.alone.append(seconds)
        a0 = fmean(self.alone) if self.alone else 0.0  # the one-token pass
        ns, ts = [float(n) for n, _ in self.drafted], [t for _, t in self.drafted]
        line = fit_spread(ns, ts)
        if line is not None:  # the drafted rounds' own line: b, and a + s
            pieces = split_step(line, a0)
            if pieces is not None:
                a, s, b = pieces
                self.step = s / a
            else:  # no one-token time measured: a from the step as last measured
                a, b = line[0] / (1 + self.step), line[1]
            self.fitted, self.pieced = b / a, True
        elif self.pieced:  # the slope holds; the step from the rounds at hand
            b = self.fitted * a0
            pieces = split_step((fmean([t - b * n for n, t in self.drafted]), b), a0) if ts else None
            if pieces is not None:
                self.step = pieces[1] / a0
        else:
            line = fit_spread([0.0] * len(self.alone) + ns, list(self.alone) + ts)
            if line is not None:
                self.fitted = line[1] / line[0]

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds: a pass over the context's last token alone, and one more drafted
        token (past the step, step() * a); None before any round, or while every round measured
        no time. a is the windows' time over their rounds' sizes in one-token passes,
        1 + step * (n > 0) + slope * n each."""
        slope = self.slope()
        units = len(self.alone) + sum(1 + self.step + slope * n for n, _ in self.drafted)
        if not units:
            return None
        a = (sum(self.alone) + sum(t for _, t in self.drafted)) / units
        return (a, slope * a) if a > 0 else None

    def slope(self) -> float:
        """b / a: one more verified node, past the first, as a fraction of a one-token pass."""
        return self.prior if self.fitted is None else self.fitted


_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target model -> VerifyCost
