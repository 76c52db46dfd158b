"""The verification rule: Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023 likewise).

Tensors and numbers only. A drafted x ~ q is accepted with probability min(1, p(x)/q(x)); at
the first rejection the target's token is drawn from the residual normalize(max(0, p - q))
("recovered"); if all k are accepted it is drawn from p at position k+1 ("bonus").
A deterministic drafter passes q=None, meaning one-hot q on its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RECOVERED = "recovered"
BONUS = "bonus"


@dataclass(frozen=True)
class Verdict:
    accepted: int  # n, 0..k: drafted tokens kept
    token: int  # the target's own token: recovered (n < k) or bonus (n == k)
    target_probs: tuple[float, ...]  # p(x_i) for each drafted x_i
    draft_probs: tuple[float, ...]  # q(x_i) for each drafted x_i

    @property
    def kind(self) -> str:
        return BONUS if self.accepted == len(self.target_probs) else RECOVERED


def accepted_mass(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """min(p, q) [..., vocab]: the probability of drafting and accepting each token."""
    return torch.minimum(p, q)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) [..., vocab]; falls back to p where rounding leaves no mass."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 1e-12, r / total.clamp_min(1e-30), p)


def one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[k] ids -> [k, vocab] one-hot q of a deterministic drafter."""
    return torch.zeros(len(tokens), vocab, device=tokens.device).scatter_(1, tokens[:, None], 1.0)


def verify(tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
           generator: torch.Generator) -> Verdict:
    """Sampling rule. tokens [k] drafted ids; q [k, vocab] or None (one-hot); p [k+1, vocab].
    Decided on the device and read back once (n, the token, p(x) and q(x) together)."""
    k = len(tokens)
    if k == 0:  # nothing drafted: the target's own token, drawn from p
        return Verdict(0, int(torch.multinomial(p[0], 1, generator=generator)), (), ())
    if q is None:
        q = one_hot(tokens, p.shape[-1])
    idx = torch.arange(k, device=p.device)
    px, qx = p[idx, tokens], q[idx, tokens]  # [k], [k]
    u = torch.rand(k, generator=generator, device=p.device)  # [k]
    rejected = u * qx >= px  # [k]: accept iff u < p(x)/q(x), i.e. with prob min(1, p/q)
    n = torch.where(rejected.any(), rejected.int().argmax(), k)  # []: the first rejection, else k
    dist = torch.where(n < k, residual(p[n], q[n.clamp(max=k - 1)]), p[k])  # [vocab] (n = k: p[k])
    token = torch.multinomial(dist, 1, generator=generator)  # [1]
    out = torch.cat([n.view(1), token, px, qx]).double().tolist()  # the one read-back (exact)
    return Verdict(int(out[0]), int(out[1]), tuple(out[2:2 + k]), tuple(out[2 + k:]))


def verify_greedy(tokens: torch.Tensor, target_argmax: torch.Tensor) -> Verdict:
    """Greedy rule (one-hot p and q): keep drafts while they equal the target's argmax.

    tokens [k]; target_argmax [k+1]. The same as `verify` with one-hot p and q, without
    building them; one read-back.
    """
    k = len(tokens)
    out = torch.cat([(tokens == target_argmax[:k]).long(), target_argmax]).tolist()  # [2k + 1]
    match, argmax = out[:k], out[k:]
    n = match.index(0) if 0 in match else k
    return Verdict(n, argmax[n], tuple(float(m) for m in match), (1.0,) * k)
