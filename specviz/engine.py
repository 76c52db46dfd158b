"""The round loop: draft k, verify them in one target pass, commit, yield a RoundEvent.

The engine sees token ids only. Randomness comes from one torch.Generator seeded per run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch

from .acceptance import Verdict, verify, verify_greedy
from .arch import check_tree_model
from .bounds import MAX_K, NEEDS_DRAFT, PROPOSERS  # here too: defined there for the command line
from .fastpath import resolve_fast
from .lm import CachedLM, bucket, draft_lm
from .loading import Pair
from .proposers import (
    AdaptiveProposer,
    HybridProposer,
    ModelProposer,
    NgramProposer,
    NoProposer,
    Proposer,
)
from .sampling import SamplingParams, process
from .tree import TreeNode, TreeVerdict, check, is_id, walk
from .treedraft import MAX_BRANCHING, MAX_NODES, TreeProposer, check_tree_settings
from .untrusted import whole
from .verifycost import VerifyCost


@dataclass(frozen=True)
class RoundEvent:
    round: int  # 1-based; == target passes so far (round 1 carries the prompt)
    k: int  # tokens drafted this round (may be below the asked k: n-gram misses, the budget); a
    # tree round: the length of the branch its walk took (its nodes: `tree`)
    draft_tokens: list[int]
    accepted: int  # n: drafted tokens kept
    token: int  # the target's own token this round
    kind: str  # "recovered" (after a rejection) or "bonus" (all k kept)
    new_tokens: list[int]  # committed this round, after truncation at max_new_tokens / EOS
    target_probs: list[float]  # p(x) for each drafted x, under the processed distribution
    draft_probs: list[float]  # q(x) likewise (1.0 for a deterministic chain drafter; a tree round's
    # are the draft's probabilities of its walked nodes, TreeNode.q, though the rule tries them one-hot)
    target_passes: int  # cumulative
    draft_passes: int  # cumulative
    draft_seconds: float  # this round
    target_seconds: float  # this round
    round_seconds: float  # this round, everything included but a CUDA graph's capture (see elapsed)
    elapsed: float  # the engine's seconds since the run started; time the caller held the
    # generator between rounds (an app drawing the page) is left out, so runs shown at different
    # rates race fairly, and so is a shape's one-off CUDA graph capture (GraphedStep: the graphed
    # path captures on first use, ZeroGPU's in every call), which no seconds above count either
    position: int  # tokens generated before this round
    source: str  # which drafter proposed: "draft", "ngram", "none", "adaptive" or "tree" (a hybrid's
    # rounds: "ngram" or "draft")
    target_cache_length: int  # after the round: == prompt + generated - 1 (cache_length)
    stop: str | None  # "eos", "length" or None (more rounds follow)
    target_top2: list[list[tuple[int, float]]] = field(default_factory=list)
    # ^ per verified position (k+1 of them): the target's two largest raw logits as (id, logit)
    tree: tuple[TreeNode, ...] = ()
    # ^ a tree round's every verified node (parent, token, depth, p, q, score, fate); chain
    #   rounds leave it empty. A tree round's draft_tokens, accepted, probs and top2 describe the
    #   walked branch: the accepted path, then the first refused child and its first children.

    @property
    def nodes(self) -> int:
        """Drafted tokens the target verified this round: the tree's nodes, or k."""
        return len(self.tree) if self.tree else self.k

    @property
    def kept(self) -> int:
        """Drafted tokens the output kept: the accepted ones, less any past an EOS among them."""
        return min(self.accepted, len(self.new_tokens))

    @property
    def overhead_seconds(self) -> float:
        """Time outside model forwards: sampling, the rule, rollback, bookkeeping."""
        return max(0.0, self.round_seconds - self.draft_seconds - self.target_seconds)

    def to_dict(self) -> dict:
        return asdict(self) | {"overhead_seconds": self.overhead_seconds}


@dataclass(frozen=True)
class Reading:
    """generate(..., progress=True): a long prompt read before round 1, one CachedLM.prefill pass
    at a time (the caller can stop the run, or check its time, between them)."""
    model: str  # "draft" or "target"
    read: int  # prompt tokens this model has cached
    total: int  # tokens it reads before round 1: all of the prompt but its last


def make_proposer(pair, proposer: str | Proposer, ngram_size: int = 3,
                  max_len: int | None = None, nodes: int | None = None,
                  branching: int | None = None, draft: CachedLM | None = None) -> Proposer:
    """A drafter by name (PROPOSERS); draft: the draft model's cache for it to draft on
    (pair_draft_lm, kept across runs), else a new one of max_len positions."""
    if not isinstance(proposer, str):
        if isinstance(proposer, type) or not callable(getattr(proposer, "propose", None)):
            raise ValueError(f"proposer must be one of {', '.join(PROPOSERS)}, or a drafter object with a "
                             "propose(ids, k, params, generator) method (an instance: NgramProposer(), "
                             f"not the class); got {proposer!r}")
        return proposer
    if proposer not in PROPOSERS:
        raise ValueError(f"unknown proposer {proposer!r}: choose one of {', '.join(PROPOSERS)}")
    if proposer in NEEDS_DRAFT and pair.draft is None:
        raise ValueError(f"proposer {proposer!r} needs a draft model: load the pair with draft=..., "
                         "or use proposer='ngram' or 'none'")
    if proposer == "none":
        return NoProposer()
    if proposer == "ngram":  # the prices stay as they are at the start of the run (replayable)
        return NgramProposer(ngram_size, *ngram_price(pair))
    if proposer == "tree":  # before any cache is made: a model that cannot verify a tree is named
        check_tree_model(pair.target, pair.target_name)
        check_tree_model(pair.draft, pair.draft_name or "the draft")
    draft = pair_draft_lm(pair, max_len) if draft is None else draft
    if proposer == "tree":
        return TreeProposer(pair.draft, pair.vocab_size, nodes, branching, VerifyCost.of(pair.target), draft)
    model = ModelProposer(pair.draft, pair.vocab_size, draft)
    if proposer == "draft":
        return model
    adaptive = AdaptiveProposer(model, VerifyCost.of(pair.target))
    if proposer == "adaptive":
        return adaptive
    return HybridProposer(adaptive, NgramProposer(max(ngram_size, 8)))


def ngram_price(pair) -> tuple[float, float]:
    """(slope, step): what the n-gram drafter prices a proposed token at, and a round that
    proposes any, in one-token target passes: the target's verify line as measured so far
    (verifycost.VerifyCost.of, fed by every run but the n-gram's own; the prior VERIFY_SLOPE and
    no step until the rounds span enough widths, e.g. a chain run and a baseline)."""
    line = VerifyCost.of(pair.target)
    return line.slope(), line.step


def check_settings(k: int, max_new_tokens: int) -> None:
    if not (whole(k) and 1 <= k <= MAX_K):
        raise ValueError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
    if not (whole(max_new_tokens) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def check_run_settings(seed, ngram_size) -> None:
    # torch's generator holds 2**64 seeds and reads a negative one as 2**64 + seed: -1 and
    # 2**64 - 1 drew the same run, so only 0..2**64-1 are taken (one run per seed)
    if not (whole(seed) and 0 <= seed < 2**64):
        raise ValueError(f"seed must be an integer in 0..2**64-1, got {seed!r}")
    if not (whole(ngram_size) and 1 <= ngram_size <= 16):
        raise ValueError(f"ngram_size must be an integer in 1..16, got {ngram_size!r}")


def generate(pair, prompt: str | list[int], *, proposer: str | Proposer = "draft", k: int = 4,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, chat: bool = False, ngram_size: int = 3,
             nodes: int | None = None, branching: int | None = None,
             progress: bool = False, target: CachedLM | None = None) -> Iterator[RoundEvent | Reading]:
    """Speculative decoding on pair; yields one RoundEvent per target forward pass.

    target: a target_lm(pair, ...) to run on, kept across runs (and a proposer drafting on a kept
    draft cache, make_proposer(draft=...)): a prompt it already holds is not read again. Unset,
    each run reads its own.

    proposer="tree" drafts a token tree of depth k: `nodes` caps the nodes verified per round
    (unset: sized each round from the measured verify cost), `branching` is each expanded
    node's number of children (unset: from treedraft.BRANCHING, widened while the tree fills).
    A prompt longer than lm.PREFILL_CHUNK tokens is read before round 1 in passes of that many
    (lm.WIDE_CHUNKS times as many for a model whose bfloat16 layers copy their weights for each
    prompt pass; round 1's events count their time); with progress=True a Reading is yielded
    after each."""
    if not isinstance(pair, Pair):  # a model's name (str.encode took the prompt), a bare model
        raise ValueError(f"pair must be a specviz.Pair: load one first, pair = specviz.load_pair(target, "
                         f"draft); got {type(pair).__name__}")
    params = SamplingParams.of(temperature, top_k, top_p)
    check_settings(k, max_new_tokens)
    check_tree_settings(nodes, branching)
    check_run_settings(seed, ngram_size)
    if not isinstance(chat, bool):  # chat="no" is a true string: it wrapped the prompt in the template
        raise ValueError(f"chat must be True or False, got {chat!r}")
    k, max_new_tokens, seed, ngram_size = int(k), int(max_new_tokens), int(seed), int(ngram_size)
    nodes, branching = (None if x is None else int(x) for x in (nodes, branching))
    ids = pair.encode(prompt, chat=chat)
    name = getattr(proposer, "name", proposer)  # a Proposer instance's, as its name would
    if proposer != "tree" and (nodes, branching) != (None, None):  # they went unread
        raise ValueError("nodes and branching shape the token tree that proposer='tree' drafts: pass "
                         "that, or leave them unset" + ("" if isinstance(proposer, str) else
                                                         " (a drafter object carries its own shape)"))
    room = round_room(name, k, branching)
    pair.check_length(len(ids), max_new_tokens, room, drafted=name in NEEDS_DRAFT)
    length = run_length(ids, max_new_tokens, room)
    check_target(pair, target, length)  # here, when called, rather than at the first round
    drafter = make_proposer(pair, proposer, ngram_size, length, nodes, branching)
    if target is not None and isinstance(drafter, TreeProposer) and drafter.lm is target:
        # a chain drafts past the committed tokens and rolls back; a tree's nodes sit in the cache
        # the verify pass would read as context (an IndexError three calls down)
        raise ValueError("a token tree needs a draft cache of its own: make_proposer(..., draft=) on "
                         "another CachedLM than target= (for the target drafting for itself, "
                         "pair_draft_lm of a pair whose draft is its target)")
    return _rounds(pair, drafter, ids, k, max_new_tokens, params, seed, length, progress, target)


def check_target(pair, target, length: int) -> None:
    """A caller's kept target (generate's target=) must be this pair's, with room for the run."""
    if target is not None and (not isinstance(target, CachedLM) or target.model is not pair.target
                               or (target.static and target.max_len < length)):
        raise ValueError(f"target must be a target_lm(pair, max_len) of this pair's target with room for "
                         f"{length} positions (the prompt, max_new_tokens and a round's drafts); got "
                         f"{type(target).__name__}" + (f" of {target.max_len}" if isinstance(target, CachedLM)
                                                        and target.static else ""))


def round_room(proposer, k: int, branching: int | None = None) -> int:
    """The most positions one round drafts beyond the output: a chain's k; a token tree's nodes,
    at most (an unset width can grow to MAX_BRANCHING)."""
    return max(MAX_NODES, bucket(branching or MAX_BRANCHING) * k) if proposer == "tree" else k


def run_length(ids: list[int], max_new_tokens: int, k: int) -> int:
    """The most positions either cache holds in a run: the prompt, the output, a round's drafts
    (k of a chain, or a tree's nodes)."""
    return len(ids) + max_new_tokens + k + 1


def cache_kwargs(model, fast: str, max_len: int | None) -> dict:
    """CachedLM arguments for a fast-path mode (fastpath.resolve_fast) and a run's length."""
    cache, steps = resolve_fast(fast, model)
    return {"cache": cache, "steps": steps, "max_len": max_len}


def target_lm(pair, max_len: int | None) -> CachedLM:
    """The target's cache and steps for runs of up to max_len positions (run_length)."""
    return CachedLM(pair.target, pair.vocab_size, refine=pair.refine,
                    **cache_kwargs(pair.target, pair.fast, max_len))


def pair_draft_lm(pair, max_len: int | None) -> CachedLM:
    """The draft's cache and steps for runs of up to max_len positions, as target_lm the target's."""
    return draft_lm(pair.draft, pair.vocab_size, **cache_kwargs(pair.draft, pair.fast, max_len))


def warm_widths(lm: CachedLM, prompt: list[int], widths, rows: int | None = None) -> None:
    """Feed the prompt, then one pass of each width after it, asking for `rows` rows (None: every
    row) as a run does (a captured graph is keyed by both): on a compiled path each width's first
    use compiles and captures its step (21-26 s a shape on the H200 run), which then falls in no
    timed round and no visitor's run."""
    lm.compiled_widths = lm.compiled_widths | set(widths)
    lm.forward(prompt)
    for w in sorted(widths):
        lm.rollback(prompt + [0])  # back to the prompt, so that the pass feeds all w tokens
        lm.forward(prompt + [1 + i % 7 for i in range(w)], last=rows or w)


def warm_steps(pair, k: int) -> None:
    """Every step a chain run at k feeds after its first round, whatever its drafter and text:
    the target's 1 (the target alone) and k + 1 (each verify, narrower ones padded to it), the
    draft's 1 and 2 (its catch-up after a fully accepted round, which a warm-up run need not
    reach: random weights rarely accept a whole draft), on the same cached steps a run then
    leases (fastpath._Slot)."""
    prompt = list(range(1, 9))
    # leased in a run's order, the draft's first (make_proposer, then _rounds), both held at once:
    # where the target drafts for itself, each then warms the slot the run will lease (warmed one
    # after the other, the target's freed slot went to the draft, and the run's target captured anew)
    draft = pair_draft_lm(pair, len(prompt) + 2) if pair.draft is not None else None
    warm_widths(target_lm(pair, len(prompt) + k + 1), prompt, (1, k + 1))
    if draft is not None:
        # the draft reads one row of each pass, its 2-token catch-up too (ModelProposer.propose)
        warm_widths(draft, prompt, (1, 2), rows=1)


def _verify_tree(target: CachedLM, ids: list[int], tree: tuple[TreeNode, ...],
                 params: SamplingParams, generator: torch.Generator):
    """One target pass over a drafted tree; (TreeVerdict, its chain-shaped Verdict, the walked
    branch's tokens, the rows [k+1, vocab] of its positions)."""
    logits = target.forward_tree(ids, [n.token for n in tree], [n.parent for n in tree])  # [1+N, vocab]
    judged: TreeVerdict = walk(tree, logits if params.greedy else process(logits, params),
                               generator, params.greedy)
    chain = judged.display_chain()
    nodes = judged.nodes
    verdict = Verdict(judged.accepted, judged.token, tuple(nodes[i].p for i in chain),
                      tuple(nodes[i].q for i in chain))
    return judged, verdict, [nodes[i].token for i in chain], logits[[0] + [1 + i for i in chain]]


def check_draft(draft, vocab_size: int, budget: int, room: int) -> None:
    """A proposer's draft (any Proposer, the caller's own included): at most `budget` tokens deep
    (what it was asked for: the output's room), a tree of at most `room` nodes (the positions the
    run's caches have left after the committed ids), token ids the target can verify, a
    well-formed tree (tree.check) and q [tokens, vocab_size] where given; ValueError naming what
    is wrong. (Shapes only: q's values stay on the device, where reading them would cost a sync
    a round.)"""
    if draft.tree and len(draft.tree) > room:
        raise ValueError(f"the proposer drafted a tree of {len(draft.tree)} nodes, more than the {room} "
                         "positions the run has left: draft a smaller tree, or name the proposer "
                         f"\"tree\" (a run of the tree drafter keeps room for {MAX_NODES} nodes a round)")
    if draft.tree:
        check(draft.tree, vocab_size)  # before its depths are read: they may be anything
    depth = max(n.depth for n in draft.tree) if draft.tree else len(draft.tokens)
    if depth > budget:
        raise ValueError(f"the proposer drafted {depth} tokens deep, more than the {budget} it was asked "
                         "for (propose's k): draft at most k tokens")
    bad = [t for t in draft.tokens if not is_id(t, vocab_size)]
    if bad:
        raise ValueError(f"the proposer drafted {bad[0]!r}, not a token id in 0..{vocab_size - 1}")
    if draft.q is not None and (not isinstance(draft.q, torch.Tensor)
                                or tuple(draft.q.shape) != (len(draft.tokens), vocab_size)):
        raise ValueError(f"the proposer's q has shape {tuple(getattr(draft.q, 'shape', ()))}: it must be "
                         f"[{len(draft.tokens)}, {vocab_size}], a distribution over the target's "
                         "vocabulary for each drafted token (or None for a deterministic drafter)")


def cache_length(target: CachedLM, stop: str | None) -> int:
    """The target cache's length a round reports. A dynamic cache's is its tensors' shape (free to
    read); a static cache keeps it on the device, where reading it is a host sync a round beyond
    the rule's: its rounds report the host's count, and the last one the cache's own, checked
    against that count (a mismatch raises)."""
    if not target.static or stop:
        return target.checked_length()
    return len(target.tokens)


def capture_seconds(lm) -> float:
    """What a model's CUDA graph captures have taken (CachedLM.capture_seconds; 0 for no model)."""
    return getattr(lm, "capture_seconds", 0.0)


def top2(top) -> list[list[tuple[int, float]]]:
    """A topk(2) result [rows, 2] as (id, logit) pairs per row, read back in one transfer."""
    rows = torch.stack([top.indices.double(), top.values.double()], -1).tolist()  # [rows, 2, 2]
    return [[(int(i), v) for i, v in row] for row in rows]


def _rounds(pair, drafter: Proposer, ids: list[int], k: int, max_new_tokens: int,
            params: SamplingParams, seed: int, length: int | None = None,
            progress: bool = False, target: CachedLM | None = None) -> Iterator[RoundEvent | Reading]:
    length = length or run_length(ids, max_new_tokens, k)
    target = target_lm(pair, length) if target is None else target
    # the baseline's step and a full verify; narrower verifies are padded to k + 1 (CachedLM.forward)
    target.compiled_widths = {1, k + 1}
    # The chain and the target alone measure the target's shared verify line here (the sizing
    # drafters, adaptive, hybrid and tree, feed the same line in their observe_round; the n-gram
    # rule keeps the price it started with).
    line = VerifyCost.of(pair.target) if isinstance(drafter, (ModelProposer, NoProposer)) else None
    generator = torch.Generator(device=pair.device).manual_seed(seed)
    prompt_len, draft_passes, target_passes, started = len(ids), 0, 0, time.perf_counter()
    paused = 0.0  # seconds the caller held the generator between rounds: not the run's time
    drafter_lm = getattr(drafter, "lm", None)
    prefill = {"draft": 0.0, "target": 0.0}  # each model's seconds reading a long prompt
    for name, lm in (("draft", drafter_lm), ("target", target)):
        if lm is None:  # the n-gram rule, the target alone, a caller's own drafter
            continue
        before, captured = lm.seconds, capture_seconds(lm)
        for read in lm.prefill(ids):
            if progress:
                held = time.perf_counter()
                yield Reading(name, read, len(ids) - 1)
                paused += time.perf_counter() - held
        captured = capture_seconds(lm) - captured  # a prompt chunk's graph (see the rounds' below)
        prefill[name], paused = lm.seconds - before - captured, paused + captured
    before_round1 = time.perf_counter() - started - paused  # round 1's time before its round
    learned = 0.0  # seconds the cost line and the drafter spent learning from the last round
    for round_ in range(1, max_new_tokens + 1):
        round_start = time.perf_counter()
        first = round_ == 1
        position = len(ids) - prompt_len
        # 1. Draft: at most what the budget can still use (the target adds one token itself).
        budget = min(k, max_new_tokens - position - 1)
        drafted_captures = capture_seconds(drafter_lm)
        draft = drafter.propose(ids, budget, params, generator)
        # what the draft's passes captured (a caller's drafter on the target's own CachedLM: the
        # target's captures while drafting), then what the verify pass captures (below)
        drafted_captures = capture_seconds(drafter_lm) - drafted_captures
        verify_captures = capture_seconds(target)
        draft_passes += draft.passes
        check_draft(draft, pair.vocab_size, budget, length - len(ids))  # room: the run's positions left
        # 2. Verify: one target pass over the uncached tail and the drafts (a chain or a tree).
        # 3. The rule: greedy compares argmaxes; sampling is Algorithm 1 (tree.walk for trees).
        target_before, passes_before, judged, drafted = target.seconds, target.passes, None, draft.tokens
        first_uses = target.first_uses
        if draft.tree:
            judged, verdict, drafted, logits = _verify_tree(target, ids, draft.tree, params, generator)
            target.keep(list(judged.path))  # gather the accepted path; the other nodes go
        else:
            logits = target.forward(ids + draft.tokens, last=len(draft.tokens) + 1)  # [k+1, vocab]
            tokens = torch.tensor(draft.tokens, dtype=torch.long, device=logits.device)  # [k]
            if params.greedy:
                verdict = verify_greedy(tokens, logits.argmax(-1))
            else:
                verdict = verify(tokens, draft.q, process(logits, params), generator)
        top = logits.topk(2, dim=-1)  # values, indices: [k+1, 2]
        # 4. Commit the accepted prefix and the target's token, stop at EOS or the budget.
        new = drafted[: verdict.accepted] + [verdict.token]
        new = new[: max_new_tokens - position]
        stop = "length" if position + len(new) >= max_new_tokens else None
        for i, t in enumerate(new):
            if t in pair.eos_ids:
                new, stop = new[: i + 1], "eos"
                break
        ids = ids + new
        target.rollback(ids)
        # counted here, not from the cache's total: another run on a kept target cache may pass
        # between this run's rounds (its passes are not this run's)
        target_passes += target.passes - passes_before
        # a CUDA graph's capture this round (a shape's first use) is a one-off, no cost of the
        # method: left out of the round's times like a caller's pause (the bench warms up instead)
        verify_captures = capture_seconds(target) - verify_captures
        paused += drafted_captures + verify_captures
        now = time.perf_counter()
        event = RoundEvent(
            round=round_, k=len(drafted), draft_tokens=list(drafted),
            accepted=verdict.accepted, token=verdict.token, kind=verdict.kind, new_tokens=new,
            target_probs=list(verdict.target_probs), draft_probs=list(verdict.draft_probs),
            target_passes=target_passes, draft_passes=draft_passes,
            draft_seconds=draft.seconds - drafted_captures + first * prefill["draft"],
            target_seconds=target.seconds - target_before - verify_captures + first * prefill["target"],
            round_seconds=(now - round_start + learned - drafted_captures - verify_captures
                           + first * before_round1),
            elapsed=now - started - paused,
            position=position,
            source=draft.source, target_cache_length=cache_length(target, stop), stop=stop,
            target_top2=top2(top),
            tree=judged.nodes if judged else ())
        # a verify pass that compiled or captured its shape is no sample of the target's cost line
        with VerifyCost.of(pair.target).unobserved() if target.first_uses > first_uses else nullcontext():
            if line is not None and round_ > 1:  # round 1 also paid the prefill
                line.observe(event.nodes, event.target_seconds)
            if hasattr(drafter, "observe_round"):  # adaptive and tree drafters size drafts by these times
                drafter.observe_round(event)
        held = time.perf_counter()
        learned = held - now  # the learning above: the next round's (it ran after this one's end)
        yield event
        paused += time.perf_counter() - held
        if stop:
            return
