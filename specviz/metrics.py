"""RunStats: a run's events folded into the numbers people compare."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from .digits import beside
from .engine import RoundEvent
from .theory import expected_tokens_per_pass
from .tree import REJECTED
from .verifycost import MIN_ROUNDS, MIN_SPREAD, fit_spread, split_step


def reach(event) -> int:
    """The drafts a chain round could have turned into output: its k, or, where the rule accepted
    a drafted EOS (the output ends at it, so fewer tokens than it accepted), the drafts before it."""
    return len(event.new_tokens) - 1 if event.accepted >= len(event.new_tokens) else event.k


@dataclass(frozen=True)
class RunStats:
    events: tuple[RoundEvent, ...]

    @classmethod
    def of(cls, events: Iterable[RoundEvent]) -> RunStats:
        """A run's rounds; what else it yielded (a Reading of a long prompt) is left out."""
        return cls(tuple(e for e in events if isinstance(e, RoundEvent)))

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.new_tokens]

    @property
    def new_tokens(self) -> int:
        return sum(len(e.new_tokens) for e in self.events)

    @property
    def cumulative(self) -> list[int]:
        """Tokens generated after each round."""
        return list(accumulate(len(e.new_tokens) for e in self.events))

    @property
    def target_passes(self) -> int:
        return self.events[-1].target_passes if self.events else 0

    @property
    def draft_passes(self) -> int:
        return self.events[-1].draft_passes if self.events else 0

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / max(self.target_passes, 1)

    @property
    def drafted(self) -> int:
        return sum(e.k for e in self.events)

    @property
    def accepted(self) -> int:
        """Drafted tokens kept in the output (RoundEvent.kept): drafts the rule accepted past an
        EOS are not counted, nor tested, in any figure here, so α, the acceptance by position and
        tokens per pass describe the same output."""
        return sum(e.kept for e in self.events)

    @property
    def rejections(self) -> int:
        """Drafts the rule tested and refused within the output: one a chain round that met a
        refusal (the drafts after it are never tested), and each refused candidate of a tree round
        (a tree tries a node's children in turn until one is kept); none past an EOS."""
        return sum(sum(n.fate == REJECTED and n.depth <= len(e.new_tokens) for n in e.tree) if e.tree
                   else e.accepted < e.k and len(e.new_tokens) > e.accepted for e in self.events)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted tokens verified (like vLLM's "acceptance rate"; a tree's: its nodes).
        Drafts the rule never tested count as failures here, and so do drafts it accepted past an
        EOS (the output left them out), so this is not the per-token chance."""
        return self.accepted / self.nodes_verified if self.nodes_verified else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance α: accepted / (accepted + rejections), the maximum-likelihood
        estimate of the chance that one tested draft is kept (0 when nothing was tested)."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else 0.0

    @property
    def k(self) -> int:
        """The largest k drafted in a round (the asked k, unless the budget cut every round)."""
        return max((e.k for e in self.events), default=0)

    @property
    def fixed_k(self) -> int | None:
        """k when every round drafted it but those the token budget cut, and the last; None when
        the rounds chose their own lengths (n-gram, adaptive; a hybrid where some round took the
        n-gram: its model rounds are labelled "draft"). Once fewer than k + 1
        tokens are left, a chain round drafts what is left less one, so its cut rounds are the
        run's tail (the last round aside) and each names the same budget, position + k + 1: the
        end of a run that stopped on it, or past an EOS that came first."""
        if not self.k or len({e.source for e in self.events} - {"draft"}) > 0:
            return None  # the chain's drafter is "draft"; adaptive, n-gram and a hybrid's mix choose
        last, rounds = self.events[-1], self.events[:-1]
        first = next((i for i, e in enumerate(rounds) if e.k != self.k), len(rounds))
        cut = rounds[first:]
        if not cut:
            return self.k
        budgets = {e.position + e.k + 1 for e in cut}
        if len(budgets) != 1 or any(e.k == self.k for e in cut):
            return None
        (budget,) = budgets
        end = last.position + len(last.new_tokens)
        ended = last.stop == "length" and budget == end or last.stop == "eos" and budget >= end
        return self.k if ended and last.k == min(self.k, budget - last.position - 1) else None

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """P(draft i kept | drafts 1..i-1 kept), for i = 1..k; None where no round reached i
        (a tree: depth i along the walked branch)."""
        return [kept / reached if reached else None for kept, reached in self.acceptance_counts]

    @property
    def acceptance_counts(self) -> list[tuple[int, int]]:
        """(rounds that kept draft i, rounds that reached it with drafts 1..i-1 kept), i = 1..k."""
        counts = []
        for i in range(1, self.k + 1):  # a position past an EOS among the kept drafts is not reached
            reached = [e for e in self.events if e.k >= i and e.kept >= i - 1 and len(e.new_tokens) >= i]
            counts.append((sum(e.kept >= i for e in reached), len(reached)))
        return counts

    @property
    def accepted_histogram(self) -> dict[int, int]:
        """How many rounds kept n drafts, n = 0..k (rounds that drafted nothing left out)."""
        counts = Counter(e.kept for e in self.events if e.k)
        return {n: counts.get(n, 0) for n in range(self.k + 1)}

    @property
    def is_tree(self) -> bool:
        """Some round verified a token tree (proposer="tree")."""
        return any(e.tree for e in self.events)

    @property
    def draft_depth(self) -> float:
        """How deep the rounds that drafted went, on average: a tree round's deepest node, a chain
        round's k. A tree's k is a cap: one sized by the verify cost often stops shallower."""
        depths = [max(n.depth for n in e.tree) if e.tree else e.k for e in self.events if e.nodes]
        return sum(depths) / len(depths) if depths else 0.0

    @property
    def nodes_verified(self) -> int:
        """Drafted tokens the target verified: every tree node, or each chain round's k."""
        return sum(e.nodes for e in self.events)

    def nodes_per_round(self) -> str:
        """A tree run's nodes verified a tree round, and a target pass where some round verified
        none (the budget's last round, a draft that could not read the context): "6.0 a tree
        round, 5.0 a target pass"; "no tree verified" where no round verified one."""
        trees = sum(bool(e.tree) for e in self.events)
        if not trees:
            return "no tree verified"
        per_tree = f"{self.nodes_verified / trees:.1f} a tree round"
        if trees == len(self.events):
            return per_tree
        per_pass = self.nodes_verified / max(len(self.events), 1)  # 1 node in 30 rounds read "0.0"
        return f"{per_tree}, {beside(per_pass, 0.0, 1)} a target pass"

    @property
    def accepted_per_node(self) -> float:
        """accepted / nodes verified: what a verified position bought (the acceptance rate)."""
        return self.acceptance_rate

    @property
    def predicted_tokens_per_pass(self) -> float | None:
        """The i.i.d. prediction at the measured α: the mean over rounds of
        (1 - α^(k_i+1)) / (1 - α) for each round's reach k_i: its draft length (a fixed-k run:
        its k), or, where the rule accepted a drafted EOS, the drafts up to it less one (the
        output ends there and α leaves the drafts past it out, so the round could hold no more).
        None for a tree run: the chain formula says nothing of trees."""
        if self.is_tree:
            return None
        if not self.events:
            return 0.0
        alpha = self.alpha  # a property that sums over every round: once, not per round
        return sum(expected_tokens_per_pass(alpha, reach(e)) for e in self.events) / len(self.events)

    @property
    def wall_seconds(self) -> float:
        return self.events[-1].elapsed if self.events else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def speedup_over(self, base: RunStats) -> float | None:
        """tokens / s over base's; None where either run measured no time (an opened trace can
        say 0 s: 0x, or 10^11x against a floor, said nothing)."""
        if self.wall_seconds <= 0 or base.wall_seconds <= 0 or not base.new_tokens:
            return None
        speedup = self.tokens_per_second / base.tokens_per_second
        return speedup if math.isfinite(speedup) and speedup > 0 else None  # (subnormal seconds)

    def decode_speedup_over(self, base: RunStats) -> float | None:
        """decode tokens / s over base's: both runs' prompt reading (round 1) left out; None for
        a run of one round, or no time measured."""
        rate, alone = self.decode_tokens_per_second, base.decode_tokens_per_second
        ratio = rate / alone if rate > 0 and alone > 0 else math.nan
        return ratio if math.isfinite(ratio) and ratio > 0 else None

    @property
    def decode_tokens(self) -> int:
        """Tokens committed after round 1, the round that also paid the prompt's prefills."""
        return self.new_tokens - (len(self.events[0].new_tokens) if self.events else 0)

    @property
    def decode_seconds(self) -> float:
        """Seconds from the end of round 1 to the end of the run: decoding with the prompt paid."""
        return self.events[-1].elapsed - self.events[0].elapsed if self.events else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """decode_tokens / decode_seconds: the rate once the prompt is in both caches. Every method
        pays the same target prefill, which on a CPU can be half of a short run's wall time and
        swamps the difference between drafters; 0 for a run of one round."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def draft_seconds(self) -> float:
        return sum(e.draft_seconds for e in self.events)

    @property
    def target_seconds(self) -> float:
        return sum(e.target_seconds for e in self.events)

    @property
    def overhead_seconds(self) -> float:
        return sum(e.overhead_seconds for e in self.events)

    @property
    def _later_draft(self) -> tuple[float, int]:
        """Draft seconds and passes after the first round that ran the draft: that round also fed
        it the prompt (round 1, or a later one where the hybrid's n-gram drafted first)."""
        first = next((i for i, e in enumerate(self.events) if e.draft_passes), None)
        if first is None:
            return 0.0, 0
        later = self.events[first + 1:]
        return sum(e.draft_seconds for e in later), self.draft_passes - self.events[first].draft_passes

    @property
    def draft_pass_seconds(self) -> float:
        """C_D: seconds of one draft pass after the round that fed the draft the prompt; that
        round's own when no later round drafted; 0 without draft passes."""
        seconds, passes = self._later_draft
        if passes:
            return seconds / passes
        return self.draft_seconds / self.draft_passes if self.draft_passes else 0.0

    @property
    def target_pass_seconds(self) -> float:
        """C_T: mean target seconds of a round after round 1 (round 1 also paid the prefill);
        round 1's own for a run of one round."""
        rounds = self.events[1:] or self.events
        return sum(e.target_seconds for e in rounds) / len(rounds) if rounds else 0.0

    @property
    def prefilled_costs(self) -> tuple[str, ...]:
        """The measured pass costs that include a prompt's prefill for want of a later round:
        "C_D" when the draft ran in no round after its first, "C_T" for a run of one round."""
        prefilled = ("C_D",) if self.draft_passes and not self._later_draft[1] else ()
        return prefilled + (("C_T",) if len(self.events) == 1 else ())

    @property
    def cost_ratio(self) -> float:
        """Measured C_D / C_T: one draft pass over one target pass (prefill rounds excluded)."""
        if not self._later_draft[1] or not self.target_pass_seconds:
            return 0.0
        return self.draft_pass_seconds / self.target_pass_seconds

    @property
    def stop(self) -> str | None:
        return self.events[-1].stop if self.events else None

    def summary(self) -> dict:
        return {
            "new_tokens": self.new_tokens, "target_passes": self.target_passes,
            "draft_passes": self.draft_passes, "tokens_per_pass": self.tokens_per_pass,
            "alpha": self.alpha, "acceptance_rate": self.acceptance_rate,
            "rejections": self.rejections, "k": self.k, "nodes_verified": self.nodes_verified,
            "accepted_per_node": self.accepted_per_node,
            "acceptance_by_position": self.acceptance_by_position,
            "accepted_histogram": self.accepted_histogram,
            "predicted_tokens_per_pass": self.predicted_tokens_per_pass,
            "wall_seconds": self.wall_seconds, "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "draft_seconds": self.draft_seconds, "target_seconds": self.target_seconds,
            "overhead_seconds": self.overhead_seconds, "cost_ratio": self.cost_ratio,
            "stop": self.stop,
        }


def target_line(spec: RunStats, base: RunStats | None = None) -> tuple[float, float, float] | None:
    """(T0, step, b) in seconds: the target's pass T(0) = T0 over no drafts and T(n) = T0 + step
    + b * n over n >= 1 drafted tokens (its nodes), from the rounds after round 1 (which also paid
    the prefill) of spec and of base, the target alone. Where spec's drafted rounds spread
    (verifycost.fit_spread) their own line gives b and T0 + step, and the one-token rounds T0
    (step at least 0); else a straight line through every round (step 0), the one-token ones as
    n = 0, as verifycost.VerifyCost does, any span doing where one-token rounds are among them
    (MIN_ROUNDS at each end still). A chain (fixed_k) beside one-token rounds gets the line
    through their mean T0 and its k-wide rounds' mean T(k), its budget-cut rounds left out, so
    break-even at its own k is exactly (k C_D + T(k)) / T0 wherever T(k) >= T0. None where
    neither fits (a fixed-k run without its baseline, whose few budget-cut last rounds are no line)
    or the fit has no positive intercept."""
    rounds = [(e.nodes, e.target_seconds) for e in spec.events[1:]]
    rounds += [(0, e.target_seconds) for e in (base.events[1:] if base else ())]
    drafted = [(float(n), t) for n, t in rounds if n]
    alone = [t for n, t in rounds if not n]
    t0 = sum(alone) / len(alone) if alone else 0.0  # the one-token pass
    line = fit_spread([n for n, _ in drafted], [t for _, t in drafted])
    pieces = split_step(line, t0) if line is not None and alone else None
    if pieces is not None:
        return pieces
    k = spec.fixed_k
    at_k = [t for n, t in drafted if n == k]  # a chain's own width: not its budget-cut last rounds
    if k and len(at_k) >= MIN_ROUNDS and len(alone) >= MIN_ROUNDS and t0 > 0:  # no time: no line
        return t0, 0.0, max(0.0, (sum(at_k) / len(at_k) - t0) / k)  # through T0 and T(k), b >= 0
    line = fit_spread([float(n) for n, _ in rounds], [t for _, t in rounds],
                      spread=1 if alone else MIN_SPREAD)
    return None if line is None else (line[0], 0.0, line[1])
