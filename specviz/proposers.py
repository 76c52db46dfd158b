"""Drafters behind one small protocol: propose(ids, k, params, generator) -> Draft.

`draft`: a small causal LM with its own KV cache (a CachedLM). `ngram`: prompt lookup, the
longest and most recent earlier occurrence of the last 1..N tokens, proposing what followed.
`none`: proposes nothing, so each round is one plain target step (the baseline).
`hybrid`: the n-gram proposal when the context has one, the draft model otherwise.
A deterministic proposal carries q=None (one-hot q in the rule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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

    def lookup(self, ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier match of the longest suffix."""
        for n in range(min(self.max_ngram, len(ids) - 1), 0, -1):
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

    @torch.inference_mode()
    def propose(self, ids, k, params, generator) -> Draft:
        start, passes = time.perf_counter(), self.lm.passes
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.lm.forward(ids + tokens, last=1)[0]  # [vocab]
            if params.greedy:
                tokens.append(int(logits.argmax()))
            else:
                q = process(logits, params)  # [vocab]
                qs.append(q)
                tokens.append(int(torch.multinomial(q, 1, generator=generator)))
        q = torch.stack(qs) if qs else None  # [k, vocab]
        return Draft(tokens, q, self.lm.passes - passes, time.perf_counter() - start, self.name)


class HybridProposer:
    """The n-gram proposal when the context repeats itself, else the draft model."""

    name = "hybrid"

    def __init__(self, model_proposer: ModelProposer, ngram: NgramProposer):
        self.model, self.ngram = model_proposer, ngram

    def propose(self, ids, k, params, generator) -> Draft:
        tokens = self.ngram.lookup(ids, k)
        if tokens:
            return Draft(tokens, None, source=self.ngram.name)
        return self.model.propose(ids, k, params, generator)
