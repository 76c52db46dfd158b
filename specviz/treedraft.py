"""The tree drafter: a dynamic draft tree (EAGLE-2) from a small causal LM.

Each round, depth 1 takes the draft's `branching` most likely tokens after the context. At each
further depth the `branching` most promising frontier nodes (by cumulative draft probability,
the product of q from the root) are expanded together in one batched draft pass with a tree
attention mask, each into its `branching` most likely children. The tree the target verifies is
the top of all drafted nodes by cumulative probability (parents always rank above children), at
most `nodes` of them; by default the size is chosen each round from the measured verify cost.
By default the width is chosen too: it starts at BRANCHING and grows by one child a round (up
to MAX_BRANCHING) while the verified tree keeps a last child the width offered, so where
verification is nearly free the tree reaches its node cap instead of 3 + 9 (k - 1) nodes.

Candidates are the draft's top tokens, deterministic given the context, so the rule in tree.py
(one-hot tries with renormalisation) keeps the output exact at any temperature.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .arch import input_rows
from .bounds import BRANCHING, MAX_BRANCHING, MAX_NODES  # here too: defined there for the command line
from .lm import CachedLM, draft_lm
from .proposers import Draft, first_uses
from .sampling import SamplingParams, process
from .tree import TreeNode, check, first_branch
from .untrusted import whole
from .verifycost import VerifyCost


def float32_product(a: float, b: float) -> float:
    """a * b rounded as float32 arithmetic rounds it (both factors float32 values): a node's
    cumulative score, like q a float32, so 9 significant digits carry it exactly in traces."""
    return float(np.float32(a) * np.float32(b))


def check_tree_settings(nodes: int | None, branching: int | None) -> None:
    if nodes is not None and not (whole(nodes) and 1 <= nodes <= MAX_NODES):
        raise ValueError(f"tree nodes must be an integer in 1..{MAX_NODES}, or unset to size the tree "
                         f"from the measured verify cost; got {nodes!r}")
    if branching is not None and not (whole(branching) and 1 <= branching <= MAX_BRANCHING):
        raise ValueError(f"tree branching must be an integer in 1..{MAX_BRANCHING}, or unset to widen "
                         f"the tree from {BRANCHING} while it fills; got {branching!r}")


class TreeProposer:
    """Drafts a token tree of depth k (see the module text). `nodes` fixes the node budget;
    unset, a node is verified only while its calibrated cumulative probability (the chance it
    is reached and kept) exceeds what its verify cost would buy at the run's own rate:
    c * score > R * slope, R being tokens per one-token target pass so far, slope the measured
    cost of one more node (VerifyCost), c = nodes kept / scores summed (prior 1). Until drafted
    rounds have measured that cost (VerifyCost.pieced: a line through the target alone's rounds
    and a chain's cannot tell one more node from the step to any drafted pass) the tree
    alternates between k and k + VerifyCost.MIN_SPREAD nodes at the prior's bar: sizes far enough
    apart to fit the line, small enough not to stall a CPU, where a node can cost half a pass.
    `branching` fixes the width; unset, it adapts (widen)."""

    name = "tree"

    def __init__(self, model, vocab_size: int, nodes: int | None = None, branching: int | None = None,
                 cost: VerifyCost | None = None, lm: CachedLM | None = None, **cache):
        check_tree_settings(nodes, branching)
        self.budget, self.branching, self.auto_width = nodes, branching or BRANCHING, branching is None
        self.vocab_size = vocab_size
        self.lm = lm or draft_lm(model, vocab_size, **cache)  # lm: as ModelProposer's
        self.readable = input_rows(model)
        self.cost = cost or VerifyCost()
        self.kept, self.predicted = 2.0, 2.0  # c = kept / predicted
        self.tokens, self.seconds = 0, 0.0  # the run so far (from round 2, model time), for R
        self.warm = False  # the first outcome _learn sees (round 1's) stays out of the calibration c
        self.last = None  # ids, drafted nodes, slot of each fed node, chosen nodes
        self.captured = False  # the latest draft compiled or captured a shape new to the draft

    def calibrated(self, score: float) -> float:
        return min(1.0, score * self.kept / self.predicted)

    def bar(self) -> float:
        """R * slope: the tokens one more verified node's cost would buy at the run's rate. Until
        the run has a measured round R is 1, the target alone's rate: a node must at least buy
        what its time would buy without drafting. Until drafted rounds have measured the slope
        (VerifyCost.pieced) it is the prior's, so that the exploring sizes are reached."""
        fit = self.cost.fit()
        rate = 1.0 if fit is None or self.seconds <= 0 else self.tokens / (self.seconds / fit[0])
        return rate * (self.cost.slope() if self.cost.pieced else self.cost.prior)

    def _learn(self, ids: list[int]) -> None:
        if self.last is None:
            return
        before, drafted, slot_of, chosen = self.last
        self.last = None
        if ids[: len(before)] != before:
            self.lm.drop_slots()
            return
        grown = ids[len(before):]
        path, node = [], -1  # the committed tokens' way through everything drafted
        for t in grown:
            node = next((i for i, n in enumerate(drafted) if n.parent == node and n.token == t), None)
            if node is None:
                break
            path.append(node)
        fed = []  # the draft's cache keeps the nodes it fed along that way
        for i in path:
            if i not in slot_of:
                break
            fed.append(slot_of[i])
        self.lm.keep(fed)
        if not self.warm:
            self.warm = True
            return
        verified = set(chosen)
        self.kept += next((j for j, i in enumerate(path) if i not in verified), len(path))
        self.predicted += sum(drafted[i].score for i in chosen)

    def observe_round(self, event) -> None:
        """The engine's measured round (a RoundEvent): its verify pass (nodes, target seconds)
        feeds the cost line, its model time the run's rate R. Only the models' own time counts:
        what the caller does between rounds (an app drawing the page) is not a verify cost.
        Round 1 also paid the prefills, and a round without a tree verified nothing drafted. Nor
        is a round where either model compiled or captured a shape new to it (0.1-0.5 s on a GPU,
        against a few ms a pass) a sample of R: it would lower R for the rest of the run."""
        if event.round == 1 or not event.tree:
            return
        self.cost.observe(event.nodes, event.target_seconds)  # paused by the engine after a capture
        if self.captured or self.cost.paused:
            return
        self.tokens += len(event.new_tokens)
        self.seconds += event.draft_seconds + event.target_seconds

    def _expand(self, drafted: list[TreeNode], parents: list[int], logits: torch.Tensor,
                params: SamplingParams) -> None:
        """Append the top `branching` children of each parent; logits [len(parents), vocab]."""
        q = logits.softmax(-1) if params.greedy else process(logits, params)  # [m, vocab]
        top = q.topk(min(self.branching, q.shape[-1]), dim=-1)  # [m, branching]
        values, indices = torch.stack([top.values.double(), top.indices.double()]).tolist()  # one read-back
        for row, parent in enumerate(parents):
            base, depth = (1.0, 1) if parent < 0 else (drafted[parent].score, drafted[parent].depth + 1)
            drafted += [TreeNode(parent, int(t), depth, v, float32_product(base, v))
                        for v, t in zip(values[row], indices[row], strict=True) if v > 0]

    def cap(self, k: int) -> int:
        """The most nodes a round may verify: the budget, else while the drafted rounds have not
        yet measured their own slope k and k + MIN_SPREAD in turn, else MAX_NODES."""
        if self.budget or self.cost.pieced:
            return self.budget or MAX_NODES
        return min(MAX_NODES, k + VerifyCost.MIN_SPREAD * (self.cost.rounds % 2))

    def _choose(self, drafted: list[TreeNode], bar: float, cap: int | None = None) -> list[int]:
        """The verified nodes: the best by score with their parents, in drafted order."""
        cap = cap or self.budget or MAX_NODES
        chosen: set[int] = set()
        for i in sorted(range(len(drafted)), key=lambda i: (-drafted[i].score, drafted[i].depth, i)):
            if len(chosen) >= cap or (self.budget is None and chosen
                                      and self.calibrated(drafted[i].score) <= bar):
                break
            if drafted[i].parent < 0 or drafted[i].parent in chosen:
                chosen.add(i)
        return sorted(chosen)

    def _frontier(self, drafted: list[TreeNode], depth: int, bar: float, cap: int) -> list[int]:
        """The nodes at depth worth expanding: the best `branching`, each able to still make the
        tree (fewer than cap rank above it; unset budget: it pays on its own)."""
        best = sorted((i for i, n in enumerate(drafted) if n.depth == depth),
                      key=lambda i: -drafted[i].score)[: self.branching]
        scores = sorted((n.score for n in drafted), reverse=True)
        return [i for i in best if (len(scores) <= cap or drafted[i].score >= scores[cap - 1])
                and (self.budget is not None or self.calibrated(drafted[i].score) > bar)]

    def widen(self, drafted: list[TreeNode], chosen: list[int]) -> None:
        """Auto width, for the next round: one child more (up to MAX_BRANCHING) when the verified
        tree kept a last child this width offered (its next sibling might have made the tree
        too), one fewer (down to BRANCHING) when it kept none of the last two. The width is set
        before a round is verified, from what the draft offered before, so the candidates stay
        the draft's own top tokens and the rule stays exact. A set width stays as it is."""
        if not self.auto_width:
            return
        rank, children = [], {}  # each drafted node's place among its siblings (0: most likely)
        for n in drafted:
            rank.append(children.get(n.parent, 0))
            children[n.parent] = rank[-1] + 1
        widest = max((rank[i] for i in chosen), default=-1)
        if widest >= self.branching - 1 and self.branching < MAX_BRANCHING:
            self.branching += 1
        elif widest < self.branching - 2 and self.branching > BRANCHING:
            self.branching -= 1

    @torch.inference_mode()
    def propose(self, ids, k, params, generator) -> Draft:
        started, passes, uses = time.perf_counter(), self.lm.passes, first_uses(self.lm)
        self.captured = False
        self._learn(ids)
        if k < 1 or (self.readable < self.vocab_size and max(ids) >= self.readable):
            return Draft([], None, 0, time.perf_counter() - started, self.name)
        bar, cap = self.bar(), self.cap(k)
        drafted: list[TreeNode] = []
        slot_of: dict[int, int] = {}  # drafted node -> its slot in the draft's cache
        self._expand(drafted, [-1], self.lm.forward(ids, last=1), params)
        for depth in range(1, k):
            frontier = self._frontier(drafted, depth, bar, cap)
            if not frontier:
                break
            for i in frontier:
                slot_of[i] = len(self.lm.slots) + frontier.index(i)
            logits = self.lm.forward_tree(ids, [drafted[i].token for i in frontier],
                                          [slot_of.get(drafted[i].parent, -1) for i in frontier])
            self._expand(drafted, frontier, logits, params)  # logits [len(frontier), vocab]
        chosen = self._choose(drafted, bar, cap)
        self.widen(drafted, chosen)
        index = {i: j for j, i in enumerate(chosen)}
        tree = tuple(TreeNode(drafted[i].parent if drafted[i].parent < 0 else index[drafted[i].parent],
                              drafted[i].token, drafted[i].depth, drafted[i].q, drafted[i].score)
                     for i in chosen)
        check(tree)
        self.last = (list(ids), drafted, slot_of, chosen)
        chain = [tree[i].token for i in first_branch([n.parent for n in tree])]  # the favourite
        self.captured = first_uses(self.lm) > uses
        return Draft(chain, None, self.lm.passes - passes, time.perf_counter() - started, self.name,
                     tree=tree)
