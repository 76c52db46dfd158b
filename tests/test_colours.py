"""The page's colours, computed rather than looked at: WCAG 2.1 contrast of each fate's text on its
chip in the light and the dark theme, what the colour-blind see of the fates and the cue besides
colour that tells each apart, and 3:1 for the marks that are not text (focus, the tree overview's
bars, the plots' lines and bars).

The colours are read from the stylesheets the page sends (assets/style.css, treeview.CSS) and from
the figures; the expected numbers are worked by hand below, so a changed colour fails here first."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from specviz import figures, lab, labview, treeview
from specviz.render import TAGS

STYLE = (Path(__file__).parent.parent / "assets" / "style.css").read_text()
FATES = ("accepted", "rejected", "recovered", "bonus", "target", "unreached")  # unreached: the tree's


def rules(css: str) -> list[tuple[list[str], dict[str, str]]]:
    """(selectors, declarations) of each rule, comments left out; an @media block's rules too."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    out = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        declarations = dict(d.split(":", 1) for d in body.split(";") if ":" in d)
        out.append(([s.strip() for s in selectors.split(",")],
                     {k.strip(): v.strip() for k, v in declarations.items()}))
    return out


def declared(selector: str, css: str = STYLE) -> dict[str, str]:
    """Every declaration of the rules naming selector exactly, the later ones winning."""
    found: dict[str, str] = {}
    for selectors, declarations in rules(css):
        if selector in selectors:
            found |= declarations
    return found


def rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return tuple(int(h[i:i + 2], 16) for i in (0, 2, 4))


def linear(colour) -> list[float]:
    """An sRGB colour's channels (hex, or 0-255 each) linearised: c/12.92 or ((c + 0.055)/1.055)^2.4."""
    channels = rgb(colour) if isinstance(colour, str) else colour
    return [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (x / 255 for x in channels)]


def luminance(colour) -> float:
    """WCAG 2.1 relative luminance of an sRGB colour."""
    r, g, b = linear(colour)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a, b) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def over(colour: str, backdrop: str, alpha: float) -> tuple[float, ...]:
    """colour at opacity alpha over backdrop, as a browser composites it (in sRGB values)."""
    return tuple(alpha * c + (1 - alpha) * b for c, b in zip(rgb(colour), rgb(backdrop), strict=True))


def hex_of(value: str) -> str:
    return re.search(r"#[0-9a-fA-F]{6}", value).group(0)


def chip(fate: str) -> tuple[str, str, float]:
    """(background, text colour, opacity) of a fate's token chip as the stylesheets declare it."""
    css = STYLE + treeview.CSS
    d = declared(f".tok.{fate}", css)
    return hex_of(d["background"]), hex_of(d["color"]), float(d.get("opacity", 1))


def test_the_contrast_formula_on_pairs_everyone_knows():
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#ffffff", "#ffffff") == pytest.approx(1.0)
    assert contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.005)  # the classic near miss
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.005)  # the lightest grey that passes


# By hand, accepted: #bbf7d0 = (187, 247, 208); each channel c/255 linearised as ((c + 0.055)/1.055)^2.4
# is (0.4969, 0.9301, 0.6308), so L = 0.2126·0.4969 + 0.7152·0.9301 + 0.0722·0.6308 = 0.8164. Its text
# #14532d = (20, 83, 45) -> (0.0070, 0.0865, 0.0262), L = 0.0652. (0.8164 + 0.05) / (0.0652 + 0.05) = 7.52.
# The others the same way (L of the chip, L of the text, ratio):
HAND = {
    "accepted": ("#bbf7d0", "#14532d", 0.8164, 0.0652, 7.52),
    "rejected": ("#fecaca", "#7f1d1d", 0.6758, 0.0548, 6.93),  # before its opacity: see below
    "recovered": ("#fed7aa", "#7c2d12", 0.7257, 0.0621, 6.92),
    "bonus": ("#bfdbfe", "#1e3a8a", 0.6890, 0.0514, 7.29),
    "target": ("#e5e7eb", "#111827", 0.7981, 0.0092, 14.33),
    "unreached": ("#f3f4f6", "#4b5563", 0.9041, 0.0889, 6.87),
}


@pytest.mark.parametrize("fate", FATES)
def test_each_fates_text_on_its_chip_by_hand(fate):
    background, text, lum_background, lum_text, ratio = HAND[fate]
    assert chip(fate)[:2] == (background, text)
    assert (luminance(background), luminance(text)) == (pytest.approx(lum_background, abs=5e-5),
                                                      pytest.approx(lum_text, abs=5e-5))
    assert contrast(background, text) == pytest.approx(ratio, abs=0.005) and ratio >= 4.5


def backdrops() -> dict[str, str]:
    """What a token chip lies on, by theme: the page and a panel (Gradio's block), light and dark,
    for the app's theme (Soft) and Gradio's default (the tests' pages). Measured in chromium as the
    nearest painted ancestor of a token (the token view: the page; the tree: a panel)."""
    import gradio as gr

    def resolve(theme, name: str, mode: str) -> str:
        value = getattr(theme, name + mode)
        while value.startswith("*"):  # in the dark theme a variable means its dark value (a CSS var)
            value = getattr(theme, value[1:] + mode, None) or getattr(theme, value[1:])
        return {"white": "#ffffff"}.get(value, value)

    out = {}
    for theme in (gr.themes.Soft(), gr.themes.Default()):
        for mode in ("", "_dark"):
            for part in ("body_background_fill", "block_background_fill"):
                out[f"{type(theme).__name__} {part}{mode}"] = resolve(theme, part, mode).lower()
    return out


def test_the_themes_backdrops_are_those_the_hand_numbers_use():
    assert backdrops() == {
        "Soft body_background_fill": "#f9fafb", "Soft block_background_fill": "#ffffff",
        "Soft body_background_fill_dark": "#0b0f19", "Soft block_background_fill_dark": "#1f2937",
        "Default body_background_fill": "#ffffff", "Default block_background_fill": "#ffffff",
        "Default body_background_fill_dark": "#0f0f11", "Default block_background_fill_dark": "#27272a"}


# The dark theme leaves the chips as they are (no .dark rule names a .tok's colours): each fate's text
# keeps the ratio above. Only the refused draft, at opacity 0.8, takes some of what lies under it:
# chip and text are each 0.8 of themselves and 0.2 of the backdrop. By hand, over white:
# chip 0.8·(254, 202, 202) + 0.2·255 = (254.2, 212.6, 212.6), L = 0.7328; text 0.8·(127, 29, 29) + 51 =
# (152.6, 74.2, 74.2), L = 0.1215; (0.7328 + 0.05) / (0.1215 + 0.05) = 4.56, the page's lowest. Over
# Soft's dark panel #1f2937 = (31, 41, 55): chip (209.4, 169.8, 172.6) L = 0.4529, text (107.8, 31.4,
# 34.2) L = 0.0429: 5.41. The dark theme lifts it (the backdrop darkens the text more than the chip).
REJECTED_OVER = {"#ffffff": 4.56, "#f9fafb": 4.59, "#0b0f19": 5.43, "#1f2937": 5.41, "#0f0f11": 5.41,
                 "#27272a": 5.37}


def test_a_refused_drafts_faded_text_stays_above_4_5_on_every_backdrop_light_and_dark():
    background, text, opacity = chip("rejected")
    assert opacity == 0.8
    assert set(REJECTED_OVER) == set(backdrops().values())
    for backdrop, ratio in REJECTED_OVER.items():
        assert contrast(over(background, backdrop, opacity), over(text, backdrop, opacity)) == \
            pytest.approx(ratio, abs=0.005), backdrop
        assert ratio >= 4.5
    for fate in FATES:  # and nothing in the dark theme recolours a chip
        for selectors, declarations in rules(STYLE + treeview.CSS):
            darkened = [s for s in selectors if s.startswith(".dark") and f".tok.{fate}" in s]
            assert not (darkened and {"color", "background", "opacity"} & set(declarations)), darkened


# Machado, Oliveira & Fernandes (2009), severity 1: the colour seen under each dichromacy, as a matrix
# on linear RGB. Distances are CIE76 ΔE*ab in CIELAB (D65).
DICHROMACY = {
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                   (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                     (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602),
                   (0.004733, 0.691367, 0.303900)),
}


def seen(colour: str, vision: str) -> tuple[float, float, float]:
    """CIELAB of colour as seen with vision ("normal" or a DICHROMACY)."""
    r, g, b = linear(colour)
    if vision != "normal":
        r, g, b = [min(1.0, max(0.0, sum(m * c for m, c in zip(row, (r, g, b), strict=True))))
                   for row in DICHROMACY[vision]]
    xyz = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b, 0.2126729 * r + 0.7151522 * g + 0.0721750 * b,
           0.0193339 * r + 0.1191920 * g + 0.9503041 * b)
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29
         for t in (xyz[0] / 0.95047, xyz[1], xyz[2] / 1.08883)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def cue(fate: str) -> tuple:
    """What marks a fate's chip besides its colours: its element, and the text decoration, the
    inset bar, the outline and the hatching that the stylesheets give it."""
    d = declared(f".tok.{fate}", STYLE + treeview.CSS)
    blank = declared(f".tok.{fate}.blank")
    return (TAGS.get(fate, "span"), d.get("text-decoration", "none"),
            re.sub(r"#[0-9a-fA-F]{6}", "", d.get("box-shadow", "none")).strip(),
            " ".join(w for w in d.get("outline", "none").split() if not w.startswith("#")),
            "hatched" if "gradient" in blank.get("background", "") else "")


def test_every_fate_has_a_cue_besides_colour_where_the_colour_blind_see_two_fates_as_one():
    """Simulated, the chips of two fates are under ΔE*ab 6 apart (easily taken for one colour on a
    chip a few pixels tall; the next closest pair is 9.9) in these cases: accepted and rejected under
    deuteranopia, the two greys (target, never reached) for everyone, rejected and recovered under
    tritanopia. Every pair of fates differs in a cue that needs no colour."""
    close = {}
    for vision in ("normal", *DICHROMACY):
        lab_of = {fate: seen(chip(fate)[0], vision) for fate in FATES}
        close[vision] = {(a, b): round(math.dist(lab_of[a], lab_of[b]), 1)
                         for a, b in itertools.combinations(FATES, 2) if math.dist(lab_of[a], lab_of[b]) < 6}
    assert close == {"normal": {("target", "unreached"): 4.7},
                     "protanopia": {("target", "unreached"): 4.6},
                     "deuteranopia": {("accepted", "rejected"): 4.6, ("target", "unreached"): 4.7},
                     "tritanopia": {("rejected", "recovered"): 5.4, ("target", "unreached"): 4.6}}
    cues = {fate: cue(fate) for fate in FATES}
    assert len(set(cues.values())) == len(FATES), cues
    assert cues["accepted"] == ("span", "none", "none", "none", "")  # the plain one: all others are marked
    assert cues["rejected"][:2] == ("del", "line-through") and cues["rejected"][4] == "hatched"
    assert cues["recovered"][2] == "inset 0 -2px" and cues["target"][2] == "inset 0 2px"  # barred below,
    # above
    assert cues["bonus"][3] == "1px dashed" and cues["unreached"][3] == "1px dotted"


# Marks that are not text need 3:1 on what lies beside them (WCAG 2.1, 1.4.11). L by hand:
# #2563eb 0.1532, #60a5fa 0.3630, #22c55e 0.4108, #9ca3af 0.3636, #f97316 0.3246; the backdrops
# #ffffff 1, #f9fafb 0.9548, #0b0f19 0.0048, #1f2937 0.0215, #0f0f11 0.0048, #27272a 0.0205.
# So #2563eb on Soft's dark panel is (0.1532 + 0.05) / (0.0215 + 0.05) = 2.84: the focus ring of the
# tree and of the sliders, which sit on a panel, fell short; #60a5fa there is (0.3630 + 0.05) /
# 0.0715 = 5.77. The overview's bars were 1.94 (target #4b5563) to 2.93 (accepted #15803d) there.
DARK_PANEL, DARK_PAGE = "#1f2937", "#0b0f19"
MARKS = {  # (dark selector, property): (light selector, colour, its ratio on white; dark colour, its
    # ratio on the dark panel)
    ("[data-tips]:focus-visible", "outline"): ("[data-tips]:focus-visible", "#2563eb", 5.17, "#60a5fa", 5.77),
    ("input[type=range]:focus-visible", "outline"): ("input[type=range]:focus-visible", "#2563eb", 5.17,
                                                     "#60a5fa", 5.77),
    (".tok.tip-current", "outline"): (".tok.tip-current", "#2563eb", 5.17, "#60a5fa", 5.77),
    (".tree-node.tip-current", "outline"): (".tree-node.tip-current", "#2563eb", 5.17, "#60a5fa", 5.77),  # ▶
    ("#tree-overview tr.tree-current", "outline"): (".tree-overview tr.tree-current", "#2563eb", 5.17,
                                                    "#60a5fa", 5.77),
    **{(f"#tree-overview .tree-bar.{bar}", prop): (f".tree-bar.{bar}", *colours) for bar, prop, *colours in (
        ("accepted", "background", "#15803d", 5.02, "#22c55e", 6.44),
        ("refused", "box-shadow", "#6b7280", 4.83, "#9ca3af", 5.78),
        ("recovered", "background", "#c2410c", 5.18, "#f97316", 5.24),
        ("bonus", "background", "#1d4ed8", 6.70, "#60a5fa", 5.77),
        ("target", "background", "#4b5563", 7.56, "#9ca3af", 5.78))},
    # the line from a node down its children: #d1d5db was 1.47:1 on white (L 0.6724)
    ("#tree .tree-kids", "border-left"): (".tree-kids", "#6b7280", 4.83, "#9ca3af", 5.78),
}
DARK_PROPERTY = {"outline": "outline-color", "border-left": "border-left-color"}


@pytest.mark.parametrize("selector, prop", list(MARKS))
def test_focus_the_overviews_bars_and_the_trees_lines_keep_3_to_1_in_both_themes(selector, prop):
    light_selector, light, light_ratio, dark, dark_ratio = MARKS[selector, prop]
    light_rule, dark_rule = declared(light_selector, STYLE + treeview.CSS), declared(".dark " + selector)
    assert hex_of(light_rule[prop]) == light
    assert contrast(light, "#ffffff") == pytest.approx(light_ratio, abs=0.005)
    assert hex_of(dark_rule[DARK_PROPERTY.get(prop, prop)]) == dark
    assert contrast(dark, DARK_PANEL) == pytest.approx(dark_ratio, abs=0.005)
    assert min(light_ratio, dark_ratio, contrast(light, "#f9fafb"), contrast(dark, DARK_PAGE),
               contrast(dark, "#27272a")) >= 3


def plot_colours(fig) -> list[str]:
    """Every colour a figure sets on its traces' lines, markers and edges and its lines across."""
    out = []
    for t in fig.data:
        marker, line = t.marker, getattr(t, "line", None)
        for value in (getattr(line, "color", None), marker.color, marker.line.color):
            out += [value] if isinstance(value, str) else list(value) if value is not None else []
    out += [s.line.color for s in fig.layout.shapes if s.line.color]
    return out


def test_the_plots_marks_stand_out_on_their_own_white_in_either_theme():
    """Gradio draws a plotly figure as it comes (no dark variant): plotly_white keeps each plot a
    white card in the dark theme, its text #2a3f5f at 10.63:1. On white, SPEC #2563eb is 5.17,
    BASE #6b7280 4.83, THEORY #d97706 3.19 (L 0.2795: 1.05 / 0.3295) and the accepted mass #16a34a
    3.30. The Monte Carlo's variants take plotly's own colours, down to 1.41 (#B6E880): their bars
    are edged in #374151, 10.31 (L 0.0519: 1.05 / 0.1019)."""
    from test_metrics import run

    spec, base = run([(4, 2), (4, 4), (4, 1)]), run([(0, 0)] * 3)
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    mc, _ = labview.monte_carlo(p, q, ["A", "B", "C"], 1_000, list(lab.VARIANTS))
    shown = [*figures.all_figures(spec, base).values(), labview.masses_figure(p, q, ["A", "B", "C"]), mc]
    for fig in shown:
        template = fig.layout.template.layout
        assert template.paper_bgcolor == template.plot_bgcolor == "white"
        assert contrast(template.font.color, "#ffffff") == pytest.approx(10.63, abs=0.005)
        for colour in plot_colours(fig):
            if colour.startswith("#"):
                assert contrast(colour, "#ffffff") >= 3, (fig.layout.title.text, colour)
    assert [contrast(c, "#ffffff") for c in ("#d97706", "#16a34a")] == [pytest.approx(3.19, abs=0.005),
                                                                       pytest.approx(3.30, abs=0.005)]
    for bar in mc.data:  # the lightest of plotly's colours among them, and the one in a pattern on white
        assert bar.marker.line.color == "#374151" and bar.marker.line.width >= 1
    assert contrast("#B6E880", "#ffffff") == pytest.approx(1.41, abs=0.005)
    assert contrast("#374151", "#ffffff") == pytest.approx(10.31, abs=0.005)


def test_each_dark_rule_names_one_selector():
    """Gradio copies each rule of the page's CSS under its own prefix, moving the rule's first
    ".dark" in front of it and no other (".dark A, .dark B" became ".dark PREFIX A, .dark PREFIX
    .dark B"): a later selector of a list never matched, and the slider's dark focus ring stayed
    #2563eb, 2.84:1 on its panel."""
    for css in (STYLE, treeview.CSS):
        for selectors, _ in rules(css):
            assert not (len(selectors) > 1 and any(".dark" in s for s in selectors)), selectors
