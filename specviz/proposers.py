"""Drafters behind one small protocol: propose(ids, k, params, generator) -> Draft.

`draft`: a small causal LM with its own KV cache (a CachedLM). `ngram`: prompt lookup, the
longest and most recent earlier occurrence of the last 1..N tokens, proposing what followed.
`none`: proposes nothing, so each round is one plain target step (the baseline).
`hybrid`: the n-gram proposal when the context has one, the draft model otherwise.
A deterministic proposal carries q=None (one-hot q in the rule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from .lm import CachedLM
from .sampling import SamplingParams, process


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # up to k proposed ids
    q: torch.Tensor | None  # [len(tokens), vocab] draft distributions, or None when one-hot
    passes: int = 0  # draft model forward passes spent
    seconds: float = 0.0
    source: str = ""  # which drafter proposed it ("draft", "ngram", "none")


class Proposer(Protocol):
    name: str

    def propose(self, ids: list[int], k: int, params: SamplingParams,
                generator: torch.Generator) -> Draft: ...


class NoProposer:
    """The baseline: no drafts, one target token per pass."""

    name = "none"

    def propose(self, ids, k, params, generator) -> Draft:
        return Draft([], None, source=self.name)


class NgramProposer:
    """Prompt lookup (Saxena 2023): match the last n tokens (n = N..1) earlier in the context."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3):
        if not 1 <= max_ngram <= 16:
            raise ValueError(f"ngram size must be in 1..16, got {max_ngram}")
        self.max_ngram = max_ngram

    def lookup(self, ids: list[int], k: int, min_ngram: int = 1) -> list[int]:
        """Up to k tokens that followed the most recent earlier match of the longest suffix."""
        for n in range(min(self.max_ngram, len(ids) - 1), min_ngram - 1, -1):
            suffix = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):  # most recent first, not the suffix itself
                if ids[start:start + n] == suffix:
                    return ids[start + n:start + n + k]
        return []

    def propose(self, ids, k, params, generator) -> Draft:
        return Draft(self.lookup(ids, k), None, source=self.name)


class ModelProposer:
    """A small causal LM drafts k tokens autoregressively, sampling from its processed q."""

    name = "draft"

    def __init__(self, model, vocab_size: int):
        self.lm = CachedLM(model, vocab_size)
        self.stop_below: float | None = None  # stop once prod of draft confidences drops below

    @torch.inference_mode()
    def propose(self, ids, k, params, generator) -> Draft:
        start, passes = time.perf_counter(), self.lm.passes
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        sure = 1.0  # the draft's own estimate that all its tokens so far are right
        for _ in range(k):
            logits = self.lm.forward(ids + tokens, last=1)[0]  # [vocab]
            if params.greedy:
                tokens.append(int(logits.argmax()))
                if self.stop_below is not None:
                    sure *= float(logits.softmax(-1).max())
            else:
                q = process(logits, params)  # [vocab]
                qs.append(q)
                tokens.append(int(torch.multinomial(q, 1, generator=generator)))
                sure *= float(q[tokens[-1]])
            if self.stop_below is not None and sure < self.stop_below:
                break
        q = torch.stack(qs) if qs else None  # [k, vocab]
        return Draft(tokens, q, self.lm.passes - passes, time.perf_counter() - start, self.name)


class HybridProposer:
    """The n-gram proposal when the context repeats itself (a match of 2+ tokens), else the
    draft model. A one-token match is too weak to beat the draft's own guess."""

    name = "hybrid"

    def __init__(self, model_proposer: ModelProposer, ngram: NgramProposer):
        self.model, self.ngram = model_proposer, ngram

    def propose(self, ids, k, params, generator) -> Draft:
        tokens = self.ngram.lookup(ids, k, min_ngram=2)
        if tokens:
            return Draft(tokens, None, source=self.ngram.name)
        return self.model.propose(ids, k, params, generator)


class AdaptiveProposer:
    """Chooses k each round to maximise expected tokens per second, then drafts with `inner`.

    It learns from what it sees: on each call the committed ids show how many of its last
    drafts were kept (acceptance by position, smoothed by a Beta prior), its own drafting time
    gives the cost of a draft pass, and the time between its calls gives the cost of a target
    pass. Expected tokens for k: 1 + sum_j prod_{i<=j} a_i; cost: k * C_D + C_T.
    Any k keeps the rule exact: this only changes what is proposed.
    """

    name = "adaptive"
    VERIFY_SLOPE = 0.04  # extra target-pass cost per extra verified token, as a fraction

    def __init__(self, inner: ModelProposer | None, prior_alpha: float = 0.75, prior_weight: float = 2.0,
                 stop_scale: float = 1.0):
        self.inner, self.stop_scale = inner, stop_scale
        self.kept = [0.0] * 64  # per draft position: times it was kept
        self.seen = [0.0] * 64  # per draft position: times it was reached
        self.prior = (prior_alpha * prior_weight, prior_weight)
        self.draft_pass, self.target_pass = None, None  # seconds, running means
        self.rounds, self.k_sum = 0, 0  # rounds observed and tokens they drafted
        self.last: tuple[list[int], list[int], float] | None = None  # (ids, drafts, end time)

    def _learn(self, ids: list[int]) -> None:
        if self.last is None:
            return
        before, drafts, ended = self.last
        if ids[: len(before)] == before:
            grown = ids[len(before):]
            n = next((i for i, (a, b) in enumerate(zip(drafts, grown, strict=False)) if a != b),
                     min(len(drafts), len(grown) - 1))
            self.observe(len(drafts), n)
        self.target_pass = self._mean(self.target_pass, time.perf_counter() - ended)

    def observe(self, drafted: int, kept: int) -> None:
        """A round drafted `drafted` tokens and the target kept the first `kept`."""
        self.rounds, self.k_sum = self.rounds + 1, self.k_sum + drafted
        for i in range(min(kept + 1, drafted)):
            self.seen[i] += 1
            self.kept[i] += i < kept

    @staticmethod
    def _mean(old: float | None, new: float, w: float = 0.3) -> float:
        return new if old is None else (1 - w) * old + w * new

    def target_cost(self, k: int) -> float:
        """Seconds for a target pass verifying k drafts: measured, growing VERIFY_SLOPE per token.

        A pass over k+1 tokens costs a little more than over one (here 0.25 s for 1 token and
        0.34 s for 9 on the 1.5B bf16 target, ~4% of a pass per extra token); the measured
        mean is taken at the mean k drafted so far.
        """
        mean_k = self.k_sum / self.rounds if self.rounds else 4.0
        base = self.target_pass / (1 + self.VERIFY_SLOPE * mean_k)
        return base * (1 + self.VERIFY_SLOPE * k)

    def choose_k(self, k_max: int) -> int:
        if not self.draft_pass or not self.target_pass:
            return min(4, k_max)
        # Prior for a position: the pooled rate so far (positions never reached borrow it).
        seen = sum(self.seen)
        pooled = (sum(self.kept) + self.prior[0]) / (seen + self.prior[1])
        a, b = pooled * self.prior[1], self.prior[1]
        best_k, best_rate, expected, reach = 0, 1.0 / self.target_cost(0), 1.0, 1.0
        for k in range(1, k_max + 1):
            reach *= (self.kept[k - 1] + a) / (self.seen[k - 1] + b)
            expected += reach
            rate = expected / (k * self.draft_pass + self.target_cost(k))
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def propose(self, ids, k, params, generator) -> Draft:
        self._learn(ids)
        k_round = self.choose_k(k) if k > 0 else 0
        if self.draft_pass and self.target_pass:  # a draft pass must buy its cost in tokens
            self.inner.stop_below = self.stop_scale * self.draft_pass / self.target_pass
        draft = self.inner.propose(ids, k_round, params, generator)
        if draft.passes and self.last is not None:  # the first call also pays the prefill
            self.draft_pass = self._mean(self.draft_pass, draft.seconds / draft.passes)
        self.last = (list(ids), list(draft.tokens), time.perf_counter())
        return replace(draft, source=self.name)
