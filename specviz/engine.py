"""The round loop: draft k, verify them in one target pass, commit, yield a RoundEvent.

The engine sees token ids only. Randomness comes from one torch.Generator seeded per run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from .acceptance import verify, verify_greedy
from .lm import CachedLM, resolve_fast
from .proposers import (
    AdaptiveProposer,
    HybridProposer,
    ModelProposer,
    NgramProposer,
    NoProposer,
    Proposer,
)
from .sampling import SamplingParams, process

MAX_K = 32
PROPOSERS = ("draft", "ngram", "none", "hybrid", "adaptive")
NEEDS_DRAFT = ("draft", "hybrid", "adaptive")


@dataclass(frozen=True)
class RoundEvent:
    round: int  # 1-based; == target passes so far (round 1 carries the prompt)
    k: int  # tokens drafted this round (may be below the asked k: n-gram misses, the budget)
    draft_tokens: list[int]
    accepted: int  # n: drafted tokens kept
    token: int  # the target's own token this round
    kind: str  # "recovered" (after a rejection) or "bonus" (all k kept)
    new_tokens: list[int]  # committed this round, after truncation at max_new_tokens / EOS
    target_probs: list[float]  # p(x) for each drafted x, under the processed distribution
    draft_probs: list[float]  # q(x) likewise (1.0 for a deterministic drafter)
    target_passes: int  # cumulative
    draft_passes: int  # cumulative
    draft_seconds: float  # this round
    target_seconds: float  # this round
    round_seconds: float  # this round, everything included
    elapsed: float  # since the run started
    position: int  # tokens generated before this round
    source: str  # which drafter proposed ("draft", "ngram", "none")
    target_cache_length: int  # after the round: == prompt + generated - 1
    stop: str | None  # "eos", "length" or None (more rounds follow)
    target_top2: list[list[tuple[int, float]]] = field(default_factory=list)
    # ^ per verified position (k+1 of them): the target's two largest raw logits as (id, logit)

    @property
    def overhead_seconds(self) -> float:
        """Time outside model forwards: sampling, the rule, rollback, bookkeeping."""
        return max(0.0, self.round_seconds - self.draft_seconds - self.target_seconds)

    def to_dict(self) -> dict:
        return asdict(self) | {"overhead_seconds": self.overhead_seconds}


def make_proposer(pair, proposer: str | Proposer, ngram_size: int = 3,
                  max_len: int | None = None) -> Proposer:
    if not isinstance(proposer, str):
        return proposer
    if proposer not in PROPOSERS:
        raise ValueError(f"unknown proposer {proposer!r}: choose one of {', '.join(PROPOSERS)}")
    if proposer in NEEDS_DRAFT and pair.draft is None:
        raise ValueError(f"proposer {proposer!r} needs a draft model: load the pair with draft=..., "
                         "or use proposer='ngram' or 'none'")
    if proposer == "none":
        return NoProposer()
    if proposer == "ngram":
        return NgramProposer(ngram_size)
    model = ModelProposer(pair.draft, pair.vocab_size, **cache_kwargs(pair.draft, pair.fast, max_len))
    if proposer == "draft":
        return model
    if proposer == "adaptive":
        return AdaptiveProposer(model)
    return HybridProposer(AdaptiveProposer(model), NgramProposer(max(ngram_size, 8)))


def check_settings(k: int, max_new_tokens: int) -> None:
    if not (isinstance(k, int) and 1 <= k <= MAX_K):
        raise ValueError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def generate(pair, prompt: str | list[int], *, proposer: str | Proposer = "draft", k: int = 4,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, chat: bool = False,
             ngram_size: int = 3) -> Iterator[RoundEvent]:
    """Speculative decoding on pair; yields one RoundEvent per target forward pass."""
    params = SamplingParams(float(temperature), int(top_k), float(top_p))
    check_settings(k, max_new_tokens)
    ids = pair.encode(prompt, chat=chat)
    pair.check_length(len(ids), max_new_tokens)
    drafter = make_proposer(pair, proposer, ngram_size, run_length(ids, max_new_tokens, k))
    return _rounds(pair, drafter, ids, k, max_new_tokens, params, seed)


def run_length(ids: list[int], max_new_tokens: int, k: int) -> int:
    """The most positions either cache holds in a run: the prompt, the output, a round's drafts."""
    return len(ids) + max_new_tokens + k + 1


def cache_kwargs(model, fast: str, max_len: int | None) -> dict:
    """CachedLM arguments for a fast-path mode (lm.resolve_fast) and a run's length."""
    cache, compiled = resolve_fast(fast, model)
    return {"cache": cache, "compiled": compiled, "max_len": max_len}


def _rounds(pair, drafter: Proposer, ids: list[int], k: int, max_new_tokens: int,
            params: SamplingParams, seed: int) -> Iterator[RoundEvent]:
    target = CachedLM(pair.target, pair.vocab_size, refine=pair.refine,
                      **cache_kwargs(pair.target, pair.fast, run_length(ids, max_new_tokens, k)))
    target.compiled_widths = {1, k + 1}  # the baseline's step and a full verify
    generator = torch.Generator(device=pair.device).manual_seed(seed)
    prompt_len, draft_passes, started = len(ids), 0, time.perf_counter()
    for round_ in range(1, max_new_tokens + 1):
        round_start = time.perf_counter()
        position = len(ids) - prompt_len
        # 1. Draft: at most what the budget can still use (the target adds one token itself).
        draft = drafter.propose(ids, min(k, max_new_tokens - position - 1), params, generator)
        draft_passes += draft.passes
        # 2. Verify: one target pass over the uncached tail and the drafts.
        target_before = target.seconds
        logits = target.forward(ids + draft.tokens, last=len(draft.tokens) + 1)  # [k+1, vocab]
        tokens = torch.tensor(draft.tokens, dtype=torch.long, device=logits.device)  # [k]
        top = logits.topk(2, dim=-1)  # values, indices: [k+1, 2]
        # 3. The rule: greedy compares argmaxes; sampling is Algorithm 1.
        if params.greedy:
            verdict = verify_greedy(tokens, logits.argmax(-1))
        else:
            verdict = verify(tokens, draft.q, process(logits, params), generator)
        # 4. Commit the accepted prefix and the target's token, stop at EOS or the budget.
        new = draft.tokens[: verdict.accepted] + [verdict.token]
        new = new[: max_new_tokens - position]
        stop = "length" if position + len(new) >= max_new_tokens else None
        for i, t in enumerate(new):
            if t in pair.eos_ids:
                new, stop = new[: i + 1], "eos"
                break
        ids = ids + new
        target.rollback(ids)
        now = time.perf_counter()
        yield RoundEvent(
            round=round_, k=len(draft.tokens), draft_tokens=list(draft.tokens),
            accepted=verdict.accepted, token=verdict.token, kind=verdict.kind, new_tokens=new,
            target_probs=list(verdict.target_probs), draft_probs=list(verdict.draft_probs),
            target_passes=target.passes, draft_passes=draft_passes,
            draft_seconds=draft.seconds, target_seconds=target.seconds - target_before,
            round_seconds=now - round_start, elapsed=now - started, position=position,
            source=draft.source, target_cache_length=target.cache_length, stop=stop,
            target_top2=[list(zip(i, v, strict=True))
                         for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)])
        if stop:
            return
