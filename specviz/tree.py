"""Token trees: the drafted tree, its attention mask, and the exact rule that walks it.

Tensors and numbers only. A tree's nodes are listed parents first; node i holds a token drafted
after its parent (parent -1: after the last committed token, the root), at depth 1 + the
parent's. The target verifies all nodes in one pass: row 0 of its output is the root's
distribution, row 1 + i node i's.

The rule (deterministic candidates, as in EAGLE-2 / SpecInfer's one-hot case): at a node, try
its children in the draft's order. With the current distribution r (at first the target's
processed p), accept child x with probability r(x); on a refusal remove x from r and
renormalise, then try the next. The first accepted child becomes the node; if none is, the
target's token is drawn from what is left of r ("recovered"). At a leaf it is drawn from p
("bonus"). Each try is Algorithm 1 with a one-hot q, so the committed tokens follow the target's
distribution exactly. Greedy: follow the child equal to the target's argmax, else emit it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from numbers import Integral

import torch

from .acceptance import BONUS, RECOVERED

ACCEPTED, REJECTED, UNREACHED = "accepted", "rejected", "unreached"
FATES = (ACCEPTED, REJECTED, UNREACHED)


@dataclass(frozen=True)
class TreeNode:
    parent: int  # index of the parent node; -1: a child of the last committed token
    token: int
    depth: int  # 1 for the root's children
    q: float  # the draft's probability of token after its parent (temperature 1 when greedy)
    score: float  # cumulative draft probability: the product of q from the root
    p: float = 0.0  # the target's processed probability of token after its parent (verified)
    fate: str = ""  # accepted / rejected / unreached once verified; "" while only drafted


@dataclass(frozen=True)
class TreeVerdict:
    path: tuple[int, ...]  # accepted node indices, root downwards
    token: int  # the target's own token after the path
    kind: str  # "recovered" (the path ends at a node with children) or "bonus" (at a leaf)
    nodes: tuple[TreeNode, ...]  # the tree with p and fate filled in

    @property
    def accepted(self) -> int:
        return len(self.path)

    def display_chain(self) -> list[int]:
        """The walked branch as a chain round shows it: the accepted path, then (after a
        refusal) the first refused child and its first children down to a leaf."""
        end = self.path[-1] if self.path else -1
        return list(self.path) + first_branch([n.parent for n in self.nodes], end)


def first_branch(parents: list[int], node: int = -1) -> list[int]:
    """node's first child, that child's first child, ... down to a leaf (-1: from the root).
    parents[i] is node i's parent; children come in the draft's order."""
    first: dict[int, int] = {}
    for i, parent in enumerate(parents):
        first.setdefault(parent, i)
    out = []
    while node in first:
        node = first[node]
        out.append(node)
    return out


def children(nodes: tuple[TreeNode, ...] | list[TreeNode]) -> dict[int, list[int]]:
    """parent index (-1: the root) -> its children's indices, in the draft's order."""
    out: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        out.setdefault(n.parent, []).append(i)
    return out


def is_id(value, size: int) -> bool:
    """value is a whole number in 0..size-1, and not a bool (True passed as the id 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool) and 0 <= value < size


def check(nodes: list[TreeNode] | tuple[TreeNode, ...], vocab_size: int | None = None) -> None:
    """Parents come first, depths follow them, and siblings carry distinct tokens (in
    0..vocab_size-1 when given); ValueError otherwise. The walk needs all of it: two siblings
    with one token would try it twice (P(x) = 1 at p(x) = 1/2), a negative id reads the last row."""
    seen: set[tuple[int, int]] = set()
    for i, n in enumerate(nodes):
        if not (isinstance(n.parent, int) and not isinstance(n.parent, bool) and -1 <= n.parent < i):
            raise ValueError(f"tree node {i}: its parent must come before it (got {n.parent!r})")
        if n.depth != (1 if n.parent < 0 else nodes[n.parent].depth + 1):
            raise ValueError(f"tree node {i}: depth {n.depth!r} is not its parent's depth + 1")
        if (n.parent, n.token) in seen:
            raise ValueError(f"tree node {i}: token {n.token!r} repeats a sibling's; siblings must differ")
        if vocab_size is not None and not is_id(n.token, vocab_size):
            raise ValueError(f"tree node {i}: token {n.token!r} is not an id in 0..{vocab_size - 1}")
        seen.add((n.parent, n.token))


def ancestors(nodes, i: int) -> list[int]:
    """Node i and its ancestors, root downwards."""
    out = []
    while i >= 0:
        out.append(i)
        i = nodes[i].parent
    return out[::-1]


def depths(parents: list[int]) -> list[int]:
    """Each slot's depth below the context (a root's 1) from its parent's slot (-1: the root)."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def mask(parents: list[int], first: int, context: int, kv_length: int, dtype: torch.dtype,
         device=None, tail: int = 0, window: int | None = None) -> torch.Tensor:
    """Additive attention mask [1, 1, tail + m, kv_length] for feeding `tail` context tokens,
    then the tree slots first..len(parents)-1, after `context - tail` cached positions.

    Slot j sits at position context + j of the cache, at position context - 1 + its depth in the
    sequence; parents[j] is its parent's slot (-1: the root). Tail rows are causal; slot j sees
    the whole context, its ancestors and itself (0), nothing else (the dtype's minimum).

    window: a sliding-window layer's span (transformers' sliding_window_overlay): a row also
    stops seeing every key whose position is `window` or more before its own, as the model's
    own mask does in a chain pass over the same tokens (keys are placed by their positions, not
    their slots: a node's ancestors sit at their depths)."""
    m, start = len(parents) - first, context - tail
    # built on the host in a few whole-tensor ops, then copied once: element-wise writes on a
    # GPU would launch a kernel per node and ancestor
    out = torch.full((tail + m, kv_length), torch.finfo(dtype).min, dtype=dtype)
    causal = torch.arange(kv_length)[None, :] <= start + torch.arange(tail)[:, None]  # [tail, kv]
    out[:tail].masked_fill_(causal, 0)
    out[tail:, :context] = 0
    rows, cols = [], []
    for r, slot in enumerate(range(first, len(parents)), start=tail):
        while slot >= 0:
            rows.append(r)
            cols.append(context + slot)
            slot = parents[slot]
    out[rows, cols] = 0
    if window is not None:
        keys = torch.arange(kv_length)  # a column's position: its slot, a node's its depth's
        keys[context:context + len(parents)] = context - 1 + torch.tensor(depths(parents), dtype=torch.long)
        queries = torch.cat([start + torch.arange(tail), keys[context + first:context + len(parents)]])
        out.masked_fill_(queries[:, None] - keys[None, :] >= window, torch.finfo(dtype).min)
    return out[None, None].to(device)


def walk(nodes: tuple[TreeNode, ...], p: torch.Tensor, generator: torch.Generator | None,
         greedy: bool) -> TreeVerdict:
    """The rule over a verified tree. p [1 + len(nodes), vocab]: row 0 the root's processed
    target distribution, row 1 + i node i's (greedy: the raw logits, only their argmax is read).

    Sampling reads the device back twice: once for every node's p(x) under its parent's row,
    each row's total and one uniform per node (drawn up front, so the walk decides on the
    host), and once for the target's own token at the end.
    """
    kids = children(nodes)
    fate = [UNREACHED] * len(nodes)
    target_p = [0.0] * len(nodes)
    path: list[int] = []
    if greedy:
        argmax = p.argmax(-1).tolist()  # [1 + nodes]
    else:
        n = len(nodes)
        rows = torch.tensor([1 + x.parent for x in nodes], device=p.device, dtype=torch.long)
        tokens = torch.tensor([x.token for x in nodes], device=p.device, dtype=torch.long)
        u = torch.rand(n, generator=generator, device=p.device)  # [n]: node i's try
        # row totals summed in float64: the host subtracts refused p(x) from them, and a float32
        # total would leave a rounding remainder where the true one is 0
        host = torch.cat([p[rows, tokens].double(), p.sum(-1, dtype=torch.float64), u.double()]).tolist()
        px, total, us = host[:n], host[n:2 * n + 1], host[2 * n + 1:]
    node = -1
    while True:
        row = node + 1
        tried = kids.get(node, [])
        if greedy:
            for c in tried:
                target_p[c] = float(nodes[c].token == argmax[row])
            nxt = next((c for c in tried if nodes[c].token == argmax[row]), None)
            for c in tried:  # tried in turn, as the sampled rule on a one-hot p: after the kept
                fate[c] = REJECTED  # child none is (each stays unreached)
                if c == nxt:
                    fate[c] = ACCEPTED
                    break
            token = argmax[row]
        else:
            # r starts as p; a refused child gets r(x) = 0 and r is renormalised (if rounding
            # leaves no mass, r is p again)
            mass, refused, nxt = total[row], [], None
            for c in tried:
                target_p[c] = px[c]
            for c in tried:
                if us[c] < px[c] / mass:
                    nxt = c
                    break
                fate[c] = REJECTED
                refused.append(nodes[c].token)
                mass -= px[c]
                if mass <= 1e-12:
                    mass, refused = total[row], []
            if nxt is not None:
                fate[nxt] = ACCEPTED
            else:
                r = p[row].clone()  # [vocab]
                r[refused] = 0.0
                r = torch.where(r.sum() > 1e-12, r, p[row])  # no mass left (rounding): p again
                token = int(torch.multinomial(r, 1, generator=generator))
        if nxt is None:
            kind = RECOVERED if tried else BONUS
            filled = tuple(replace(x, p=target_p[i], fate=fate[i]) for i, x in enumerate(nodes))
            return TreeVerdict(tuple(path), int(token), kind, filled)
        path.append(nxt)
        node = nxt

