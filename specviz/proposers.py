"""Drafters behind one small protocol: propose(ids, k, params, generator) -> Draft.

`draft`: a small causal LM with its own KV cache (a CachedLM). `ngram`: prompt lookup, an
earlier occurrence of the longest suffix of 1..N tokens (the one that continues the last kept
copy, else the most recent; with no match, where that copy left off), proposing as much of
what followed as the run's record says will pay.
`none`: proposes nothing, so each round is one plain target step (the baseline).
`hybrid`: the n-gram proposal when the context repeats its last 4+ tokens, else `adaptive`.
`adaptive`: the draft model, drafting each round until one more token would not pay for itself.
A deterministic proposal carries q=None (one-hot q in the rule).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import nn

from .arch import input_rows
from .lm import CachedLM, draft_lm
from .sampling import SamplingParams, process
from .untrusted import whole
from .verifycost import VERIFY_SLOPE, VerifyCost


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # up to k proposed ids
    # [len(tokens), vocab] draft distributions, or None when one-hot. Each row a distribution with
    # q(x) > 0 at its drafted x, as the rule needs (the engine checks the shape only: the values
    # stay on the device)
    q: torch.Tensor | None
    passes: int = 0  # draft model forward passes spent
    seconds: float = 0.0
    source: str = ""  # which drafter proposed it (RoundEvent.source)
    confidences: tuple[float, ...] = ()  # the draft's top probability at each drafted position
    tree: tuple | None = None  # tree.TreeNode, parents first: a token tree (tokens: its first branch)


class Proposer(Protocol):
    """A drafter. One with a draft model also has `lm`, its CachedLM: the engine reads a long
    prompt into it before round 1 (CachedLM.prefill)."""

    name: str

    def propose(self, ids: list[int], k: int, params: SamplingParams,
                generator: torch.Generator) -> Draft: ...


def first_uses(lm) -> int:
    """How many of a drafter's model passes compiled or captured a shape new to it (CachedLM's
    count; 0 on the eager path and for a model-free or caller's own drafter)."""
    return getattr(lm, "first_uses", 0)


def kept_of(proposal: list[int], grown: list[int]) -> int:
    """How many of a round's proposed tokens the target kept, given the ids the round committed
    (the kept prefix, then the target's own token)."""
    return next((i for i, (a, b) in enumerate(zip(proposal, grown, strict=False)) if a != b),
                min(len(proposal), len(grown) - 1))


class NoProposer:
    """The baseline: no drafts, one target token per pass."""

    name = "none"

    def propose(self, ids, k, params, generator) -> Draft:
        return Draft([], None, source=self.name)


def copy_on(ids: list[int], at: int, k: int) -> list[int]:
    """k tokens copied from ids[at:] as the output copies them: where the copy reaches the end of
    ids it reads on in what it has just proposed (the copy's period is len(ids) - at), so a run
    of one token repeated, or a loop shorter than k, is proposed k tokens at a time, not cut at
    its period (ids[at:at + k] proposed one token a round in "a a a a")."""
    out = ids[at:at + k]  # (at < len(ids))
    period = len(ids) - at
    while len(out) < k:
        out.append(out[len(out) - period])
    return out


class NgramProposer:
    """Prompt lookup (Saxena 2023): match the last n tokens (n = N..1) earlier in the context,
    then propose only as many of the tokens that followed (reading on in the copy itself where it
    reaches the context's end: copy_on) as pay for their verification. Of
    several matches it takes the one that continues the last kept copy (see match()); when
    nothing matches, it reads on from where that copy left off.

    A proposed token costs one more verified position (`slope` of a one-token target pass), and
    a round that proposes anything also pays the step from a one-token pass to a wider one
    (`step`): the engine passes the target's measured verify line, verifycost.VerifyCost, as it
    stands when the run starts (VERIFY_SLOPE and no step before any is measured). A token buys
    one only if it and all before it are kept. The proposer learns from the run, per match
    length n, how often the first proposed token is kept (a_1, prior 1/2), and how often a token
    after a kept one is kept (a_c, prior 4/5: copies come in runs). It proposes token j while
    P(first j kept) = a_1 * a_c^(j-1) > R * slope, R being the run's tokens per unit of
    target-pass cost so far. The first token is proposed while it may still pay: while a_1 one
    posterior standard deviation up clears the bar, so a match length with a short record is
    still tried, and one whose record says its first token is rarely kept (short matches in
    prose, where verifying costs half a pass) proposes nothing and lets the target go alone. The
    step is paid once a round, so the proposal as a whole must pay for it: it stands only while
    the tokens it is expected to keep (with a_1 one sd up) exceed R * (step + slope * length).
    Deterministic: it counts costs in passes, not seconds, and its prices are fixed for the run,
    so the k explorer replays it exactly (Recording.ngram_slope, Recording.ngram_step).
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, slope: float = VERIFY_SLOPE, step: float = 0.0,
                 reads_on: bool = True):
        """reads_on: a copy that reaches the context's end reads on in itself (copy_on); False cuts
        it there, as the rule did before 2026-12-06 (the k explorer replays older traces so)."""
        if not (whole(max_ngram) and 1 <= max_ngram <= 16):
            raise ValueError(f"ngram size must be in 1..16, got {max_ngram!r}")
        self.max_ngram, self.slope, self.step, self.reads_on = max_ngram, slope, step, reads_on
        self.first: dict[int, list[float]] = {}  # match length -> [first token kept, proposals]
        self.later = [0.0, 0.0]  # [kept, reached] for tokens after a kept one
        self.tokens, self.cost = 0.0, 0.0  # the run so far, cost in target passes
        self.last: tuple[list[int], list[int], int, int] | None = None  # ids, proposal, n,
        # where the copy starts in ids
        self.pointer: int | None = None  # where continuing the last kept copy reads next
        self._seen: list[int] = []  # the context indexed so far, and n-gram -> where it ends
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def match(self, ids: list[int], k: int, min_ngram: int = 1) -> tuple[list[int], int, int]:
        """Up to k tokens that followed an earlier match of the longest suffix (n = max_ngram..
        min_ngram), n (0 when nothing matches), and where those tokens start in ids (-1).

        Of several matches, the first one at or after the copy pointer (where the last kept copy
        would read on) wins, else the most recent: output that rewrites its input copies it in
        order, so the next piece to copy follows the last one. Each n is a dictionary lookup and
        two bisections: a context of one token repeated costs no more than any other."""
        self._extend(ids)
        for n in range(min(self.max_ngram, len(ids) - 1), min_ngram - 1, -1):
            ends = self._ends.get(tuple(ids[-n:]), [])  # ascending ends of earlier copies
            hi = bisect_right(ends, len(ids) - 2)  # the suffix itself ends at len(ids) - 1
            at = None
            if self.pointer is not None:  # the first match at or after the pointer
                lo = bisect_left(ends, self.pointer - 1, 0, hi)
                at = ends[lo] + 1 if lo < hi else None
            if at is None and hi:  # else the most recent
                at = ends[hi - 1] + 1
            if at is not None:
                return self._copy(ids, at, k), n, at
        return [], 0, -1

    def _copy(self, ids: list[int], at: int, k: int) -> list[int]:
        return copy_on(ids, at, k) if self.reads_on else ids[at:at + k]

    def _extend(self, ids: list[int]) -> None:
        """Index every n-gram (n = 1..max_ngram) of ids by its end positions, ascending, extending
        the index as ids grow (a run, or the k explorer's replay, calls with ever longer contexts:
        no rescan each round)."""
        if ids[: len(self._seen)] != self._seen:  # another context: index it afresh
            self._seen, self._ends = [], {}
        for e in range(len(self._seen), len(ids)):
            for n in range(1, min(self.max_ngram, e + 1) + 1):
                self._ends.setdefault(tuple(ids[e - n + 1:e + 1]), []).append(e)
        self._seen = list(ids)

    def lookup(self, ids: list[int], k: int, min_ngram: int = 1) -> list[int]:
        """The full match continuation, untrimmed (the hybrid's n-gram branch); it moves the copy
        pointer like proposal() does."""
        self._learn(ids)
        tokens, n, at = self.match(ids, k, min_ngram)
        self.last = (list(ids), list(tokens), n, at)
        return tokens

    def _learn(self, ids: list[int]) -> None:
        if self.last is None:
            return
        before, proposal, n, at = self.last
        if ids[: len(before)] != before:
            return
        grown = ids[len(before):]
        kept = kept_of(proposal, grown)
        if kept:
            self.pointer = at + kept + 1  # past the kept copy and the token the target put after it
        if proposal:
            first = self.first.setdefault(n, [0.0, 0.0])
            first[0], first[1] = first[0] + (kept > 0), first[1] + 1
            if kept > 0:
                self.later[0] += kept - 1
                self.later[1] += min(kept, len(proposal) - 1)
        self.tokens += len(grown)
        self.cost += 1 + (self.step if proposal else 0.0) + self.slope * len(proposal)

    def proposal(self, ids: list[int], k: int) -> list[int]:
        """This round's proposal for context ids (learning from the previous call's outcome)."""
        self._learn(ids)
        tokens, n, at = self.match(ids, k)
        if not tokens and self.pointer is not None and self.pointer < len(ids):
            # nothing matches, e.g. the output just changed one token of what it copies: read on
            at = self.pointer  # n stays 0: these proposals learn their own first-token rate
            tokens = self._copy(ids, at, k)
        kept, seen = self.first.get(n, [0.0, 0.0])
        a_first = (kept + 1) / (seen + 2)  # the Beta(kept + 1, seen - kept + 1) posterior's mean
        hope = a_first + math.sqrt(a_first * (1 - a_first) / (seen + 3))  # one posterior sd up
        a_later = (self.later[0] + 4) / (self.later[1] + 5)
        rate = (self.tokens + 2) / (self.cost + 2)  # R: tokens per one-token pass's cost
        bar = rate * self.slope
        length, sure = (1, a_first) if tokens and hope > bar else (0, 1.0)
        while 0 < length < len(tokens) and sure * a_later > bar:
            sure *= a_later
            length += 1
        # the step is paid once a round: the whole proposal must buy more than all it costs
        expected = hope * sum(a_later ** j for j in range(length))  # tokens kept, one sd up
        if length and expected <= rate * (self.step + self.slope * length):
            length = 0
        tokens = tokens[:length]
        self.last = (list(ids), list(tokens), n, at)
        return tokens

    def propose(self, ids, k, params, generator) -> Draft:
        return Draft(self.proposal(ids, k), None, source=self.name)


class ModelProposer:
    """A small causal LM drafts k tokens autoregressively, sampling from its processed q.

    q is over the target's vocabulary (vocab_size ids): ids the draft cannot produce get zero
    mass. A context holding an id the draft cannot read gets no draft (the target goes alone)."""

    name = "draft"

    def __init__(self, model, vocab_size: int, lm: CachedLM | None = None, **cache):
        """lm: the draft's cache to draft on, kept across runs (a prompt it holds is not read
        again); unset, a new one (draft_lm with `cache`)."""
        self.vocab_size = vocab_size
        self.lm = lm or draft_lm(model, vocab_size, **cache)
        self.readable = input_rows(model)
        self.stop = None  # optional: called with each token's confidence; True ends the draft
        self.report_confidences = False  # the adaptive drafter learns from them; plain drafts skip it

    @torch.inference_mode()
    def propose(self, ids, k, params, generator) -> Draft:
        start, passes = time.perf_counter(), self.lm.passes
        if self.readable < self.vocab_size and max(ids) >= self.readable:
            return Draft([], None, 0, time.perf_counter() - start, self.name)
        pad = self.vocab_size - self.lm.vocab_size  # ids the draft cannot produce: q = 0
        picks: list[torch.Tensor] = []  # each [1], fed back on the device (CachedLM.forward_next)
        qs: list[torch.Tensor] = []
        confidences: list[float] = []
        report = self.report_confidences or self.stop is not None
        for j in range(k):
            logits = (self.lm.forward(ids, last=1) if j == 0 else self.lm.forward_next(picks[-1]))[0]
            if params.greedy:
                picks.append(logits.argmax(-1, keepdim=True))
                if report:  # the max softmax (a read-back a token: the stop rule needs it)
                    confidences.append(float(1.0 / (logits - logits[picks[-1]]).exp().sum()))
            else:
                qs.append(nn.functional.pad(process(logits, params), (0, pad)))  # [vocab]
                picks.append(torch.multinomial(qs[-1], 1, generator=generator))
                if report:
                    confidences.append(float(qs[-1].max()))
            if self.stop is not None and self.stop(confidences[-1]):
                break
        tokens = torch.cat(picks).tolist() if picks else []  # the draft's one read-back
        self.lm.settle(tokens)
        q = torch.stack(qs) if qs else None  # [len(tokens), vocab]: the stop may end it before k
        return Draft(tokens, q, self.lm.passes - passes, time.perf_counter() - start, self.name,
                     tuple(confidences))


class HybridProposer:
    """The n-gram proposal when the context repeats its last 4+ tokens, else the draft model
    with adaptive length. Measured on the bench prompts against a 2-token match: +2..6% in
    every class; a shorter match is too weak to beat the draft's own guess."""

    name = "hybrid"
    MIN_MATCH = 4

    def __init__(self, model_proposer: AdaptiveProposer, ngram: NgramProposer):
        self.model, self.ngram = model_proposer, ngram

    @property
    def lm(self):
        return self.model.lm

    def propose(self, ids, k, params, generator) -> Draft:
        tokens = self.ngram.lookup(ids, k, min_ngram=self.MIN_MATCH)
        if tokens:
            self.model.forget()
            return Draft(tokens, None, source=self.ngram.name)
        return replace(self.model.propose(ids, k, params, generator), source=self.model.inner.name)

    def observe_round(self, event) -> None:
        self.model.observe_round(event)  # an n-gram round still measures the target's verify cost


class DraftLength:
    """When to stop drafting: one more draft token must pay for itself at the run's own rate.

    After drafting token j with confidence c_j (the draft's top probability), the chance that
    all j drafts are kept is s_j = prod_i a(c_i), with a(c) = 1 - lam * (1 - c) the calibrated
    acceptance: lam = rejections seen / rejections the raw confidences predicted (prior 1).
    One more draft token can be kept only if all j are, so it buys at most s_j tokens, and
    nearly that: drafts are kept in runs, and within a kept run the next token is kept far more
    often than on average (measured here, taking a(c_j) for it instead lost 8% on chat). It
    costs a draft pass plus one more verified position, C_D + slope * C_T, worth R tokens a
    second at the run's own rate R. So: draft on while s_j > R * (C_D + slope * C_T).
    Pure bookkeeping: the live AdaptiveProposer feeds it measured times and the measured verify
    line, the k explorer feeds it recorded ones, so both run the same rule.
    """

    def __init__(self, draft_pass: float, target_pass: float, prior: float = 2.0,
                 slope: float = VERIFY_SLOPE):
        self.draft_pass, self.target_pass = draft_pass, target_pass  # C_D; C_T for one token
        self.slope = slope  # one more verified token, as a fraction of C_T
        self.rejected, self.predicted = prior, prior  # lam = rejected / predicted
        self.tokens, self.seconds = 0.0, 0.0  # the run so far, for R

    def rate(self) -> float:
        """R, tokens per second: measured, or two tokens per draft-4 round before any round."""
        if self.seconds > 0:
            return self.tokens / self.seconds
        return 2.0 / (4 * self.draft_pass + self.round_target(4))

    def round_target(self, k: int) -> float:
        return self.target_pass * (1 + self.slope * k)

    def acceptance(self, confidence: float) -> float:
        return max(0.0, 1.0 - self.rejected / self.predicted * (1.0 - confidence))

    def stopper(self):
        """A fresh per-round stop test: call it with each drafted token's confidence."""
        bar = self.rate() * (self.draft_pass + self.slope * self.target_pass)
        sure = 1.0

        def stop(confidence: float) -> bool:
            nonlocal sure
            sure *= self.acceptance(confidence)
            return sure <= bar

        return stop

    def observe(self, confidences: list[float], kept: int, tokens: int, seconds: float | None) -> None:
        """A round drafted len(confidences) tokens, the target kept `kept`, committing `tokens`
        in `seconds` (draft and target; None: a round whose time is no sample of R)."""
        for i, c in enumerate(confidences[: kept + 1]):
            self.predicted += 1.0 - c
            self.rejected += i == kept
        if seconds is not None:
            self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds


class AdaptiveProposer:
    """Chooses each round's draft length (at most k) to maximise tokens per second.

    The first two rounds draft min(4, k) to measure the costs; from then on the draft model drafts
    until DraftLength says one more token would not pay for itself. It learns from the engine's
    measured rounds (`observe_round`): how many of its drafts were kept, the draft's time per pass
    (C_D), and the target's verify line T(n) = C_T + b * n (a VerifyCost, shared per target
    model), whose slope b / C_T prices one more drafted token. Only the models' own time counts:
    what the caller does between rounds (an app drawing the page) is no cost of drafting. Any
    length keeps the rule exact: this only changes what is proposed.
    """

    name = "adaptive"

    def __init__(self, inner: ModelProposer, cost: VerifyCost | None = None):
        self.inner = inner
        inner.report_confidences = True
        self.cost = cost or VerifyCost()
        self.rule: DraftLength | None = None
        self.draft_pass: float | None = None  # seconds, running mean
        self.last: Draft | None = None  # the latest draft, until its round is observed
        self.fresh = True  # the draft's next round first catches up on unseen context
        self.captured = False  # the latest draft compiled or captured a shape new to its model

    @property
    def lm(self):
        return self.inner.lm

    def forget(self) -> None:
        """Another drafter ran in between (hybrid): the next round is not our draft's, and the
        one after it first feeds the draft what the other drafter's rounds committed."""
        self.last, self.fresh = None, True

    @staticmethod
    def _mean(old: float | None, new: float, w: float = 0.3) -> float:
        return new if old is None else (1 - w) * old + w * new

    def observe_round(self, event) -> None:
        """The engine's measured round (a RoundEvent). A round whose draft first caught up on
        the prompt or on an n-gram streak (the hybrid) is no fair sample of the draft's cost, and
        round 1 also paid the target's prefill: the rule learns from the other rounds. A round
        where either model compiled or captured a new shape (0.1-0.5 s, against a few ms a pass
        on a GPU; the engine pauses the verify line then) still teaches the rule its drafts' fate,
        but not their time: taken in C_D's running mean, one capture would stop drafting for
        a dozen rounds."""
        draft, self.last = self.last, None
        if event.round == 1:  # a new run: the draft caught up now, or will in its first round
            self.fresh = draft is None
            return
        self.cost.observe(event.nodes, event.target_seconds)  # whoever drafted: the target's cost
        if draft is None or event.draft_tokens != draft.tokens:
            return
        if self.fresh:
            self.fresh = False
            return
        timed = not (self.captured or self.cost.paused)
        if draft.passes and timed:
            self.draft_pass = self._mean(self.draft_pass, draft.seconds / draft.passes)
        fit = self.cost.fit()
        if fit is None or (self.rule is None and not timed):  # nothing to price a token by yet
            return
        target_pass, per_token = fit
        if self.rule is None:
            self.rule = DraftLength(self.draft_pass or draft.seconds, target_pass)
        self.rule.draft_pass = self.draft_pass or self.rule.draft_pass
        self.rule.target_pass, self.rule.slope = target_pass, per_token / target_pass
        self.rule.observe(list(draft.confidences), event.accepted, len(event.new_tokens),
                          event.draft_seconds + event.target_seconds if timed else None)

    def propose(self, ids, k, params, generator) -> Draft:
        self.inner.stop = self.rule.stopper() if self.rule is not None else None
        uses = first_uses(getattr(self.inner, "lm", None))
        draft = self.inner.propose(ids, min(4, k) if self.rule is None else k, params, generator)
        self.last, self.captured = draft, first_uses(getattr(self.inner, "lm", None)) > uses
        return replace(draft, source=self.name)
