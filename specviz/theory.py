"""Closed forms from the papers (numbers in, numbers out)."""

from __future__ import annotations


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens per target pass] for i.i.d. acceptance alpha: (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def break_even_tokens(k: int, cost_ratio: float, verify_slope: float = 0.0, step: float = 0.0) -> float:
    """Tokens per pass a round must beat to pay for k >= 1 drafts: the round's time over the
    target alone's time per token, (k * C_D + T(k)) / T(0) = 1 + step + k * (cost_ratio +
    verify_slope), with T(n) = T(0) * (1 + step + verify_slope * n) the target's pass verifying
    n >= 1 drafts and cost_ratio = C_D / T(0). verify_slope = step = 0 is Leviathan et al.'s
    assumption (verifying is free): 1 + k C_D/C_T."""
    return 1.0 + step + k * (cost_ratio + verify_slope)
