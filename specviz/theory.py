"""Closed forms from the papers (numbers in, numbers out)."""

from __future__ import annotations


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens per target pass] for i.i.d. acceptance alpha: (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def break_even_tokens(k: int, cost_ratio: float) -> float:
    """Tokens per pass a round must beat to pay for k drafts: 1 + k * C_D / C_T."""
    return 1.0 + k * cost_ratio
