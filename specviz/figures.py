"""Plotly figures from RunStats, for the app's Run tab (service.run_views, replay_view)."""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Collection

import plotly.graph_objects as go

from .digits import beside, percent
from .metrics import RunStats, reach, target_line
from .theory import break_even_tokens, expected_tokens_per_pass

SPEC, BASE, THEORY = "#2563eb", "#6b7280", "#d97706"
# Plot widths in a 1400 px window: the Run tab's plots two abreast (HALF_PX) or across its column,
# the lab's two abreast across the page, the k explorer's across it.
HALF_PX, COLUMN_PX, PAGE_HALF_PX, PAGE_PX = 390, 800, 600, 1270
LEGEND_CHARS = 48  # a legend entry's line in a HALF_PX plot: its symbol and 48 characters fill it
# a legend entry is its symbol and gap and about CHAR_PX a character of its longest line (plotly's
# 12 px text, measured: a 48-character entry 308 px wide, a column of 23-character ones 177 px);
# a row is the plot area (the figure less MARGIN_PX) wide
CHAR_PX, SYMBOL_PX, MARGIN_PX = 5.6, 48, 70
LINE_PX, PLOT_HEIGHT, AXIS_TITLE_PX = 17, 340, 60
MAX_K_PLOT = 16
# A title fits a 375 px phone's plot in TITLE_CHARS characters: plotly's 17 px title is 7.6 to 8.1 px
# a character (chromium), and starts 5% in; the phone's plots are 309 px wide, 283 in the token
# tree's panel (TREE_TITLE_CHARS). "Monte Carlo: 200,000 one-token rounds per variant", 386 px, ran
# 92 px past its plot's edge there
TITLE_CHAR_PX, PHONE_PLOT_PX, TREE_PHONE_PLOT_PX = 8.2, 309, 283
TITLE_CHARS, TREE_TITLE_CHARS = (int(0.95 * px / TITLE_CHAR_PX) for px in (PHONE_PLOT_PX, TREE_PHONE_PLOT_PX))


def _layout(fig: go.Figure, title: str, x: str, y: str, width: int = HALF_PX) -> go.Figure:
    """Title, axes and a legend below them (fit_legend) for a plot about `width` px wide."""
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=PLOT_HEIGHT,
                      margin=dict(l=50, r=20, t=45, b=AXIS_TITLE_PX), template="plotly_white",
                      legend=dict(orientation="h"))
    fit_legend(fig, width)
    return fig


def reference_line(fig: go.Figure, y: float, name: str, color: str, dash: str, layer: str = "above") -> None:
    """A level across the plot, named in the legend: a label written on the line sat over the
    bars' counts it crossed (the acceptance plot's α hid position 3's "11/12" and the top of 4's
    bar, the baseline's label the bars it crossed). layer="below" draws it beneath the traces and
    their text (α runs through the bars' counts)."""
    fig.add_hline(y=y, line_dash=dash, line_color=color, layer=layer)
    fig.add_scatter(x=[None], y=[None], mode="lines", name=name, line=dict(dash=dash, color=color),
                    hoverinfo="skip")


def tokens_per_pass(spec: RunStats) -> go.Figure:
    """Tokens committed by each round against the baseline's one per pass."""
    rounds = [e.round for e in spec.events]
    fig = go.Figure(go.Bar(x=rounds, y=[len(e.new_tokens) for e in spec.events], name="speculative",
                           marker_color=SPEC))
    reference_line(fig, 1.0, "baseline: 1 token/pass", BASE, "dash")
    return _layout(fig, "Tokens per target pass, by round", "round (target pass)", "tokens")


def _both_runs(spec: RunStats, base: RunStats | None, x_of, mode: str, title: str, x: str) -> go.Figure:
    """Tokens so far after each round, speculative and baseline, against x_of(event); both from
    the origin, so a run's wait for its first tokens (the prompt's reading) shows."""
    fig = go.Figure()
    for stats, name, color, dash, symbol in ((spec, "speculative", SPEC, "solid", "circle"),
                                             (base, "baseline", BASE, "dash", "square")):
        if stats and stats.events:  # told apart by dash and symbol too: in grey the two are one
            fig.add_scatter(x=[0] + [x_of(e) for e in stats.events], y=[0] + stats.cumulative, name=name,
                            mode=mode, line=dict(color=color, dash=dash), marker_symbol=symbol)
    return _layout(fig, title, x, "tokens")


def cumulative_tokens(spec: RunStats, base: RunStats | None) -> go.Figure:
    return _both_runs(spec, base, lambda e: e.target_passes, "lines+markers",
                      "Tokens against target passes", "target passes")


def acceptance_by_position(spec: RunStats) -> go.Figure:
    rates, counts = spec.acceptance_by_position, spec.acceptance_counts
    fig = go.Figure(go.Bar(x=list(range(1, len(rates) + 1)), y=rates, marker_color=SPEC, name="measured",
                           text=[f"{kept}/{reached}" if reached else "" for kept, reached in counts],
                           textposition="outside", cliponaxis=False,  # a 0/1 bar has no inside
                           hovertemplate="position %{x}: %{text} kept<extra></extra>"))
    fig.update_xaxes(dtick=1)  # positions are whole: no 0.5, 1.5 ticks after a k=2 run
    if spec.drafted:  # a tree's α is per candidate; its bars, any candidate at that depth kept
        what = "per-candidate" if spec.is_tree else "per-token"
        reference_line(fig, spec.alpha, f"{what} α = {percent(spec.alpha)}", THEORY, "dot", "below")
    fig.update_yaxes(range=[0, 1.15])  # room for a full bar's count above it
    return _layout(fig, "Acceptance by draft position", "draft position i",
                   "P(kept | 1..i-1 kept)")


def k_prediction(spec: RunStats, chain: RunStats | None = None, k: int | None = None,
                 base: RunStats | None = None) -> go.Figure:
    """(1 - α^(k+1))/(1 - α) over k at the measured α, the measured point, and break-even.
    A tree run gets no chain prediction: its measured point at the depth it drafted (k caps it), and
    the chain's at k.

    Break-even is the round's time over the target alone's per token (theory.break_even_tokens),
    priced by the target's measured line T(n) = T0 + Δ + b n (metrics.target_line: the run's rounds
    and the baseline's, Δ the step to any drafted pass where the run's own drafted rounds spread);
    without a spread of n to fit it, Leviathan's 1 + k C_D/C_T, which assumes
    verifying k tokens costs one pass (on a CPU without bf16 matrix hardware it costs ~1 + k/2)."""
    if spec.is_tree:
        return _tree_points(spec, chain, k)  # k unknown (a trace without it): no cap is named
    ks = list(range(1, MAX_K_PLOT + 1))
    fig = go.Figure()
    if spec.drafted:  # α is measured only where drafts were tested (the table says "—" too)
        fig.add_scatter(x=ks, y=[expected_tokens_per_pass(spec.alpha, k) for k in ks],
                        name=f"i.i.d. prediction at α = {percent(spec.alpha)}", line_color=THEORY)
    line, costs = target_line(spec, base), None  # (C_D, b, Δ) over T0, for a varying k's own bar
    if line is not None:
        t0, step, b = line
        ratio, slope, step = spec.draft_pass_seconds / t0, b / t0, step / t0
        stepped = f", any drafted pass +{step:.2f}·T₀" if step else ""
        n = spec.fixed_k
        at_n = [e.target_seconds for e in spec.events[1:] if e.nodes == n]
        if n and not step and at_n and math.isclose(t0 + b * n, sum(at_n) / len(at_n), rel_tol=1e-9):
            stepped += f"; a line through the 1- and {n + 1}-token passes: exact at k={n}, a guess elsewhere"
        if not any(not e.nodes for e in spec.events[1:]) and not (base and base.events[1:]):
            stepped += ("; no one-token pass measured yet: T₀ is the drafted rounds' line at 0 drafts, "
                        "any step to a drafted pass in it")
        # no draft pass after the one that fed it the prompt: C_D is that round's, prefill and all
        prefilled = (" from its first round, the prompt's prefill included"
                     if "C_D" in spec.prefilled_costs else "")
        costs = ratio, slope, step
        fig.add_scatter(x=ks, y=[break_even_tokens(k, ratio, slope, step) for k in ks],
                        name=f"break-even {'1 + Δ/T₀' if step else '1'} + k·(C_D + b)/T₀ (measured: "
                             f"C_D = {ratio:.2f}·T₀{prefilled}, each verified token +{slope:.2f}·T₀"
                             f"{stepped})", line=dict(dash="dash", color=BASE))
    elif spec.cost_ratio:
        costs = spec.cost_ratio, 0.0, 0.0
        fig.add_scatter(x=ks, y=[break_even_tokens(k, spec.cost_ratio) for k in ks],
                        name=f"break-even 1 + k·C_D/C_T (C_D/C_T={spec.cost_ratio:.2f}; assumes verifying "
                             "k tokens costs one pass)", line=dict(dash="dash", color=BASE))
    if spec.fixed_k:  # a chain (the budget may cut its last rounds)
        fig.add_scatter(x=[spec.k], y=[spec.tokens_per_pass], mode="markers", name="this run",
                        marker=dict(size=12, color=SPEC, symbol="diamond"))
        later = spec.events[-1].target_passes - spec.events[0].target_passes
        if costs is not None and later:  # the break-even prices rounds after round 1, the prompt paid
            even, after = break_even_tokens(spec.k, *costs), spec.decode_tokens / later
            if (spec.tokens_per_pass >= even) != (after >= even):  # a round 1 unlike the rest
                fig.add_scatter(x=[spec.k], y=[after], mode="markers",
                                name=f"this run after round 1 ({after:.2f} a pass: the rounds the "
                                     "break-even prices, on the other side of it)",
                                marker=dict(size=10, color=SPEC, symbol="diamond-open", line=dict(width=2)))
        if any(reach(e) != spec.k for e in spec.events):  # the curve's k+1 a pass is out of reach
            fig.add_scatter(x=[spec.k], y=[spec.predicted_tokens_per_pass], mode="markers",
                            name="i.i.d. prediction for its rounds' reach (the budget or an EOS cut "
                                 "the last)", marker=dict(size=10, color=THEORY))
    elif spec.k:  # n-gram, adaptive, hybrid: each round drafts its own length
        mean_k = spec.drafted / len(spec.events)
        fig.add_scatter(x=[mean_k], y=[spec.tokens_per_pass], mode="markers",
                        name=f"this run (k varies by round: mean {mean_k:.1f})",
                        marker=dict(size=12, color=SPEC, symbol="diamond"))
        fig.add_scatter(x=[mean_k], y=[spec.predicted_tokens_per_pass], mode="markers",
                        name="i.i.d. prediction for its rounds' k", marker=dict(size=10, color=THEORY))
        if costs is not None:  # the curve at the mean k prices every round as drafting that many
            fig.add_scatter(x=[mean_k], y=[own_break_even(spec.events, *costs)], mode="markers",
                            name="break-even for its rounds' k",
                            marker=dict(size=10, color=BASE, symbol="line-ew-open", line=dict(width=3)))
    if not fig.data:  # a run that drafted nothing (an n-gram that never matched, no drafter)
        fig.add_annotation(text="no round drafted a token: no α to predict from, no k to plot",
                           showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return _layout(fig, "Tokens per pass against k", "k (tokens drafted per round)",
                   "tokens per target pass")


def own_break_even(events, ratio: float, slope: float, step: float) -> float:
    """Tokens per pass a run of varying k must beat: the mean over its rounds of each round's time
    over T0, its own draft passes at C_D = ratio T0 (a hybrid's n-gram rounds make none) and its
    verify at T(n) = T0 (1 + step + slope n), a round that drafted nothing a one-token pass. The
    curve at the run's mean k prices every round as drafting that many, each by a draft pass."""
    before = [0, *(e.draft_passes for e in events[:-1])]  # RoundEvent.draft_passes: cumulative
    return sum(1 + (step + slope * e.nodes if e.nodes else 0.0) + ratio * (e.draft_passes - passes)
               for e, passes in zip(events, before, strict=True)) / len(events)


def _tree_points(spec: RunStats, chain: RunStats | None, k: int | None) -> go.Figure:
    """The tree run at the depth it drafted (k caps it), the chain at its k."""
    fig = go.Figure()
    capped = f" (k={k} caps its depth)" if k else ""
    for stats, name, color, symbol in ((spec, f"this tree run{capped}", SPEC, "diamond"),
                                       (chain, "the chain at the same k", BASE, "square")):
        if stats and stats.events:
            fig.add_scatter(x=[stats.draft_depth], y=[stats.tokens_per_pass], mode="markers",
                            name=f"{name}: {stats.draft_depth:.1f} deep a round on average",
                            marker=dict(size=12, color=color, symbol=symbol))
    fig.add_annotation(text="the i.i.d. chain prediction is not for trees", showarrow=False,
                       xref="paper", yref="paper", x=0.5, y=0.95)
    return _layout(fig, f"Tokens per pass at k={k}: measured" if k else "Tokens per pass: measured",
                   "depth drafted a round (mean)", "tokens per target pass")


def tree_nodes(spec: RunStats) -> go.Figure:
    """Each tree round's accepted length against the nodes it verified; a marker's area grows
    with the rounds at that point."""
    counts = Counter((e.nodes, e.kept) for e in spec.events if e.tree)
    points = sorted(counts.items())
    fig = go.Figure(go.Scatter(
        x=[x for (x, _), _ in points], y=[y for (_, y), _ in points], mode="markers", name="rounds",
        marker=dict(size=[6 + 4 * math.sqrt(n) for _, n in points], color=SPEC, opacity=0.7),
        text=[f"{n} round{'s' * (n != 1)}" for _, n in points],
        hovertemplate="%{x} nodes, %{y} accepted: %{text}<extra></extra>"))
    trees = [e for e in spec.events if e.tree]
    if trees:
        mean = sum(e.kept for e in trees) / len(trees)
        reference_line(fig, mean, f"mean accepted {mean:.2f}", THEORY, "dot")
    return _layout(fig, "Accepted against nodes verified", "nodes verified in the round",
                   "drafted tokens accepted")


def tree_vs_chain(spec: RunStats, chain: RunStats | None, k: int | None = None) -> go.Figure:
    """Tokens per target pass of the tree run (k caps its depth) and of the chain drafter at k."""
    names = [f"token tree (depth {spec.draft_depth:.1f} a round)"]
    values, colors = [spec.tokens_per_pass], [SPEC]
    if chain is not None and chain.events:
        names.append(f"chain (draft model, k={k or chain.k})")
        values.append(chain.tokens_per_pass)
        colors.append(BASE)
    labels = [beside(v, (1.0, *values)) for v in values]  # never rounded onto the other bar or 1
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colors, text=labels,
                           textposition="auto", name="tokens per target pass"))
    reference_line(fig, 1.0, "target alone", BASE, "dash")
    fig.update_yaxes(range=[0, 1.2 * max(1.0, *values)])  # headroom: the taller bar touched the top
    if len(names) == 1:
        # a live run's chain is still to come; a run stopped or cut by the time limit (or a trace
        # saved so) has none, and "it follows a live tree run" had its visitor wait for it
        fig.add_annotation(text="no chain run to compare: it runs after the tree run<br>and its "
                                "baseline, unless the run stopped before it", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.95)
    depth = f" (k={k})" if k else ""
    return _layout(fig, f"Tree against chain{depth}", "drafter", "tokens per target pass")


def tokens_over_time(spec: RunStats, base: RunStats | None) -> go.Figure:
    return _both_runs(spec, base, lambda e: e.elapsed, "lines", "Tokens against wall-clock time",
                      "engine seconds (page drawing left out)")


def all_figures(spec: RunStats, base: RunStats | None, chain: RunStats | None = None,
                k: int | None = None, names: Collection[str] | None = None) -> dict[str, go.Figure]:
    """The run's figures; a tree run adds "tree_nodes" and "tree_chain" (chain: the chain drafter
    at the same depth k, when it has run). names: only those are made (None: all)."""
    makers = {"tokens_per_pass": lambda: tokens_per_pass(spec),
              "cumulative": lambda: cumulative_tokens(spec, base),
              "acceptance": lambda: acceptance_by_position(spec),
              "k_prediction": lambda: k_prediction(spec, chain, k, base),
              "time": lambda: tokens_over_time(spec, base)}
    if spec.is_tree:
        makers |= {"tree_nodes": lambda: tree_nodes(spec),
                   "tree_chain": lambda: tree_vs_chain(spec, chain, k)}
    figures = {name: make() for name, make in makers.items() if names is None or name in names}
    for name, fig in figures.items():  # the page's layout: the width each is shown at, and rows
        fig.for_each_trace(lambda t: t.update(name=wrapped(t.name)) if t.name else None)
        fit_legend(fig, COLUMN_PX if name in WIDE else HALF_PX)
    for row in ROWS:  # side by side on the page: one height, the taller one's
        shown = [figures[name] for name in row if name in figures]
        for fig in shown:
            fig.update_layout(height=max(f.layout.height for f in shown))
    return figures


ROWS = (("tokens_per_pass", "cumulative"), ("acceptance", "k_prediction"), ("tree_nodes", "tree_chain"))
WIDE = {"time"}  # across the page's column; the others two abreast


def wrapped(name: str) -> str:
    """A legend entry in lines of at most LEGEND_CHARS (plotly's legend never wraps: a break-even
    line's measured costs ran off the plot's edge)."""
    return "<br>".join(textwrap.wrap(name, LEGEND_CHARS)) if len(name) > LEGEND_CHARS else name


def legend_lines(names: list[str], width: int = HALF_PX) -> int:
    """Lines a horizontal legend of these entries takes in a plot `width` px wide, laid out as
    plotly does: in one row where they all fit, else in a grid of columns as wide as the widest
    entry, each row as tall as its tallest entry."""
    parts = [name.split("<br>") for name in names]
    widths = [SYMBOL_PX + CHAR_PX * max(len(line) for line in entry) for entry in parts]
    room = width - MARGIN_PX
    per_row = len(parts) if sum(widths) <= room else max(1, int(room // max(widths)))
    return sum(max(len(entry) for entry in parts[i:i + per_row]) for i in range(0, len(parts), per_row))


def fit_legend(fig: go.Figure, width: int = HALF_PX) -> None:
    """The legend below the x axis's title, and the figure taller by its lines, so that a long
    legend neither runs off the figure nor squeezes the plot (it sat at a fraction of the plot's
    height, over the axis title once it had four entries; the lab's nine Monte Carlo entries left
    the bars 91 px)."""
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    if len(names) < 2 and not (names and fig.layout.showlegend):
        fig.update_layout(height=PLOT_HEIGHT, margin=dict(b=AXIS_TITLE_PX))
        return  # plotly shows no legend for a single trace
    room = LINE_PX * legend_lines(names, width) + 10
    fig.update_layout(height=PLOT_HEIGHT + room, margin=dict(b=AXIS_TITLE_PX + room),
                      legend=dict(yref="container", y=0, yanchor="bottom", x=0, xanchor="left"))
