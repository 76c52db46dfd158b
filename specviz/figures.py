"""Plotly figures from RunStats. Plain figures: the app shows them, the benchmark saves them."""

from __future__ import annotations

import plotly.graph_objects as go

from .metrics import RunStats
from .theory import break_even_tokens, expected_tokens_per_pass

SPEC, BASE, THEORY = "#2563eb", "#6b7280", "#d97706"
MAX_K_PLOT = 16


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=340,
                      margin=dict(l=50, r=20, t=45, b=60), template="plotly_white",
                      legend=dict(orientation="h", y=-0.35))
    return fig


def tokens_per_pass(spec: RunStats) -> go.Figure:
    """Tokens committed by each round against the baseline's one per pass."""
    rounds = [e.round for e in spec.events]
    fig = go.Figure(go.Bar(x=rounds, y=[len(e.new_tokens) for e in spec.events], name="speculative",
                           marker_color=SPEC))
    fig.add_hline(y=1.0, line_dash="dash", line_color=BASE, annotation_text="baseline: 1 token/pass")
    return _layout(fig, "Tokens per target pass, by round", "round (target pass)", "tokens")


def _both_runs(spec: RunStats, base: RunStats | None, x_of, mode: str, title: str, x: str) -> go.Figure:
    """Tokens so far after each round, speculative and baseline, against x_of(event)."""
    fig = go.Figure()
    for stats, name, color in ((spec, "speculative", SPEC), (base, "baseline", BASE)):
        if stats and stats.events:
            fig.add_scatter(x=[x_of(e) for e in stats.events], y=stats.cumulative, name=name,
                            mode=mode, line_color=color)
    return _layout(fig, title, x, "tokens")


def cumulative_tokens(spec: RunStats, base: RunStats | None) -> go.Figure:
    return _both_runs(spec, base, lambda e: e.target_passes, "lines+markers",
                      "Tokens against target passes", "target passes")


def acceptance_by_position(spec: RunStats) -> go.Figure:
    rates = spec.acceptance_by_position
    fig = go.Figure(go.Bar(x=list(range(1, len(rates) + 1)), y=rates, marker_color=SPEC,
                           name="measured"))
    if spec.drafted:
        fig.add_hline(y=spec.alpha, line_dash="dot", line_color=THEORY,
                      annotation_text=f"per-token α = {spec.alpha:.2f}")
    fig.update_yaxes(range=[0, 1.05])
    return _layout(fig, "Acceptance by draft position", "draft position i",
                   "P(kept | 1..i-1 kept)")


def k_prediction(spec: RunStats) -> go.Figure:
    """(1 - α^(k+1))/(1 - α) over k at the measured α, the measured point, and break-even."""
    ks = list(range(1, MAX_K_PLOT + 1))
    fig = go.Figure(go.Scatter(x=ks, y=[expected_tokens_per_pass(spec.alpha, k) for k in ks],
                               name=f"i.i.d. prediction at α={spec.alpha:.2f}", line_color=THEORY))
    if spec.cost_ratio:
        fig.add_scatter(x=ks, y=[break_even_tokens(k, spec.cost_ratio) for k in ks],
                        name=f"break-even 1 + k·C_D/C_T (C_D/C_T={spec.cost_ratio:.2f})",
                        line=dict(dash="dash", color=BASE))
    if spec.k:
        fig.add_scatter(x=[spec.k], y=[spec.tokens_per_pass], mode="markers", name="this run",
                        marker=dict(size=12, color=SPEC, symbol="diamond"))
    return _layout(fig, "Tokens per pass against k", "k (tokens drafted per round)",
                   "tokens per target pass")


def tokens_over_time(spec: RunStats, base: RunStats | None) -> go.Figure:
    return _both_runs(spec, base, lambda e: e.elapsed, "lines", "Tokens against wall-clock time",
                      "seconds")


def all_figures(spec: RunStats, base: RunStats | None) -> dict[str, go.Figure]:
    return {"tokens_per_pass": tokens_per_pass(spec),
            "cumulative": cumulative_tokens(spec, base),
            "acceptance": acceptance_by_position(spec),
            "k_prediction": k_prediction(spec),
            "time": tokens_over_time(spec, base)}
