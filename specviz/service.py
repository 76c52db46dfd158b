"""What the app runs: on the store's pair (store.ModelStore loads it once), stream a speculative run
then the baseline as views (after a token-tree run, the chain drafter at the same depth as well, for
the comparison).

Plain values out (HTML strings, plotly figures); the app only wires them to components. Every
job here honours the operator's Limits: prompt tokens, samples, and a time budget per job.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import torch

from . import treeview
from .compare import Comparison, compare
from .detok import token_pieces
from .digits import beside
from .engine import (
    NEEDS_DRAFT,
    Reading,
    generate,
    make_proposer,
    pair_draft_lm,
    round_room,
    run_length,
    target_lm,
)
from .explorer import EXPLORER_PROPOSERS, record
from .figures import all_figures
from .lab import joint_two_sample_tv
from .loading import Pair
from .metrics import RunStats
from .render import Span, round_spans, to_html
from .settings import CUSTOM, Limits, RunSettings, clip, markdown_text, public_message
from .store import ModelStore, made_here, pair_models
from .trace import Trace
from .tracecheck import ngram_replayable
from .views import implausible_race, race_text, stats_html, timeline_html, verdict_html


@dataclass(frozen=True, eq=False)
class Sides:
    """The rounds of a streamed view that sent its headline plot alone, the plots beside it left as
    the page had them (they come every SIDE_PLOT_SECONDS): a run that ends before its finished view
    (Stop, an error, ZeroGPU's limit) makes them anew from these, or they stay up to 10 s older
    than the headline. Equal only to itself (the app makes each one's plots once: app.caught_up)."""
    spec: RunStats
    base: RunStats | None
    k: int

    def figures(self) -> dict:
        """Every plot of these rounds, the headline among them (made as the view made it)."""
        return all_figures(self.spec, self.base, k=self.k)


@dataclass(frozen=True)
class View:
    status: str
    text_html: str = ""
    timeline_html: str | None = ""  # None: the page keeps the one it has (a streaming view: _view)
    stats_html: str = ""
    verdict_html: str = ""
    figures: dict = field(default_factory=dict)
    spec: RunStats | None = None
    base: RunStats | None = None
    comparison: Comparison | None = None
    trace: Trace | None = None
    tree_html: str = ""  # a round's token tree (or the note that chain runs have none)
    tree_round: int = 0  # which: the last while a run streams, the fullest once it is kept
    tree_overview: str | None = ""  # every round of a tree run on one line (None: as timeline_html)
    chain: RunStats | None = None  # a tree run's comparison: the chain drafter at the same k
    sides: Sides | None = None  # a view whose plots are its headline alone: the others' rounds

    @property
    def is_tree(self) -> bool:
        return self.spec is not None and self.spec.is_tree


def _over_budget(limits: Limits, what: str, fix: str = "ask for fewer tokens or samples") -> str:
    return (f"Stopped {what} at this deployment's time limit of {limits.max_job_seconds:g} s per job "
            f"(operators: SPECVIZ_MAX_JOB_SECONDS): {fix}")



def _reading(what: str, r: Reading) -> str:
    return f"{what}: reading the prompt into the {r.model}, {r.read} of {r.total} tokens"


# While a run streams, rebuild the plots, the round timeline and the tree overview (each sent
# whole) at most this often, and no more often than keeps their cost within RENDER_SHARE of the
# job's time, yet at least every PLOT_SECONDS_MAX (one slow rebuild, the process's first, must not
# stop them). A 512-token run's plots took 0.3-0.5 s on a shared 2-core CPU: once a second, a run
# at 0.3 s a round spent 146 s rendering views beside its 244 s of rounds, all on the job's clock.
PLOT_SECONDS, PLOT_SECONDS_MAX = 1.0, 5.0
RENDER_SHARE = 0.1
# ... and send the page a view at most this often: its text grows by appending (Gradio's stream
# sends only what is added), its counters and round tree are small. Each view was the whole text
# and timeline again (Gradio's diff finds no common prefix): 62 MiB for a 200-round run a view a
# round; at this pace still 83 MiB for a 512-token run at 0.3 s a round, now 15 MiB
VIEW_SECONDS = 0.25
# Of the plots, the headline (tokens per pass) comes with every rebuild, the others at most every
# SIDE_PLOT_SECONDS: the browser draws a plot afresh at each update of it (Gradio's Plot: Plotly from
# scratch in a new element, after once more in the old one), 25-70 ms a plot on a shared 2-core CPU.
# All five at each rebuild made 11-15 s of long tasks on the page over a 512-token run's 75 s; 6-7 s
# now. The finished run's view has them all; a run that ends before it (Stop, an error) has the app
# make them from the rounds of the last headline it sent (View.sides). While the baseline runs, the
# headline is the race (the tokens over time: the speculative run's tokens per pass no longer
# change), and while the chain comparison runs no plot changes; the first rebuild of each phase has
# them all.
SIDE_PLOT_SECONDS = 10.0
HEADLINE, RACE = ("tokens_per_pass",), ("time",)


class _Parts:
    """What only the speculative run's rounds change in a view (its token text, timeline and tree
    views), made once for each number of its rounds and spans: the baseline's and the chain's views
    (four a second, for minutes on a CPU) rendered them again, unchanged, each time."""

    def __init__(self):
        self.key, self.made = None, {}

    def get(self, key: tuple, name: tuple, make, once: bool = False):
        """The part `name` at `key` (the speculative run's spans and rounds), made the first time it
        is asked for; with once, None every later time (the page has it: a part that Gradio sends
        whole, the timeline, went again with every refresh of the plots)."""
        if key != self.key:
            self.key, self.made = key, {}
        if name in self.made:
            return None if once else self.made[name]
        self.made[name] = made = make()
        return made

    def forget(self, *kinds: str) -> None:
        """Make the parts of these kinds (a name's first item) afresh when next asked for."""
        self.made = {name: part for name, part in self.made.items() if name[0] not in kinds}


def _view(status, pair, spans, spec, base=None, comparison=None, greedy=True, plots=True, chain=None,
          k=None, pieces_of=None, kept=False, parts: _Parts | None = None, figures=None) -> View:
    """plots=False leaves View.figures empty and the timeline and tree overview None: the page keeps
    those it shows; figures: the names of those to make (None: all), the page keeps the others.
    kept: the run is over (until then its text is left growing: render.to_html, and the timeline
    and overview are None where this run's parts sent them already), and its tree panel opens on
    its fullest round (treeview.fullest_round). parts: the run's _Parts."""
    number = treeview.fullest_round(spec.events) if kept else len(spec.events)
    parts = parts or _Parts()
    made = partial(parts.get, (len(spans), len(spec.events)))
    trees = made(("trees", number), lambda: treeview.tree_views(
        spec.events, pieces_of or token_text(pair.tokenizer), number, greedy=greedy))
    timeline = made(("timeline",), lambda: timeline_html(spans, spec), once=not kept) if plots else None
    overview = made(("overview", number), lambda: trees[1], once=not kept) if plots else None
    return View(status, made(("text", kept), lambda: to_html(spans, growing=not kept)), timeline,
                stats_html(spec, base, chain), verdict_html(comparison, pair.tokenizer, greedy),
                all_figures(spec, base, chain, k, figures) if plots else {}, spec, base, comparison, None,
                trees[0], number, overview, chain)


def token_text(tokenizer=None, spans: tuple[Span, ...] | list[Span] = (), vocab_size: int | None = None,
               known: dict | None = None) -> treeview.Pieces:
    """pieces_of(context, tokens) for the tree views: with a tokenizer (every id below
    vocab_size), the text each token adds read after context and the tokens before it
    (detok.token_pieces: a split character shows whole on the token that completes it); else
    each token's text as the run's spans or recording showed it, else ⟨id⟩."""
    texts = {s.token: s.text for s in spans}
    texts.update({int(t): x for t, x in (known or {}).items()})
    cache: dict[tuple, list[str]] = {}

    def pieces_of(context, tokens) -> list[str]:
        key = (tuple(context), tuple(tokens))
        if key not in cache:
            ids = key[0] + key[1]
            if tokenizer is not None and all(vocab_size is None or 0 <= t < vocab_size for t in ids):
                cache[key] = token_pieces(tokenizer, list(key[0]), list(key[1]))
            else:
                cache[key] = [texts.get(t, f"⟨{t}⟩") for t in key[1]]
        return cache[key]

    return pieces_of


def node_text(events, spans, tokenizer) -> dict[str, str]:
    """A trace's node_text: {id: text} of every tree-node token of the events, so that an opened
    trace names its nodes without the tokenizer, as the live page did. Each is the token's text
    alone (token_pieces without context), less a character it leaves unfinished: a token of part
    of one is "" (the live page shows the character whole on a node that completes it after its
    branch). A token the spans also show is named so too: its text in the output can hold the
    end of a character split before it there, which a node elsewhere does not (a node's ' fo'
    read '�� fo'). Keyed by str(id), as JSON keeps it. (Traces before 2026-12-07 name only the
    tokens no span shows.)"""
    ids = sorted({n.token for e in events for n in e.tree})
    return {str(t): token_pieces(tokenizer, [], [t])[0] for t in ids}


def trace_text(trace: Trace, pair: Pair | None = None):
    """pieces_of for a trace's tree views: the loaded pair's tokenizer when this pair made the trace
    (same target, draft and dtype, as the lab asks), else the texts the trace itself holds."""
    if made_here(trace, pair):
        by_token = token_text(pair.tokenizer, vocab_size=pair.vocab_size)
        return committed_pieces(trace.events, trace.spans, by_token)
    recording = trace.recording
    known = {**((recording.token_text or {}) if recording else {}), **(trace.node_text or {})}
    return committed_pieces(trace.events, trace.spans, token_text(None, trace.spans, known=known))


def committed_pieces(events, spans, fallback: treeview.Pieces) -> treeview.Pieces:
    """pieces_of for a run's tree views that gives each round's committed tokens the texts its
    spans show them with (the Run tab's: a piece can depend on the tokens before it, and the last
    of a finished run carries the mark of a character it leaves unfinished), else fallback's."""
    texts: dict[int, list[str]] = {}  # round -> its committed tokens' texts, as the run showed them
    for sp in spans:
        if sp.emitted:
            texts.setdefault(sp.round, []).append(sp.text)
    committed = {(tuple(context), tuple(e.new_tokens)): texts.get(e.round)
                 for e, context in zip(events, treeview.contexts(events), strict=True)}

    def pieces_of(context, tokens) -> list[str]:
        shown = committed.get((tuple(context), tuple(tokens)))
        return shown if shown is not None and len(shown) == len(tokens) else fallback(context, tokens)

    return pieces_of


def tree_round(trace: Trace | None, round_number, pair: Pair | None = None) -> tuple[str, str]:
    """(round HTML, overview HTML) of a kept run's tree round: the playback. ValueError naming the
    fix for a missing run or a round out of range."""
    if trace is None:
        raise ValueError("no run yet: run the token tree drafter first (or open a trace)")
    if not treeview.tree_run(trace.events):
        return treeview.chain_html(), ""
    greedy = trace.settings.get("temperature", 0) == 0
    return treeview.tree_views(trace.events, trace_text(trace, pair), round_number, greedy)


def cut_short(trace: Trace) -> bool:
    """Whether the job's time limit stopped this run before its end (run_views keeps it so): its
    last round, or its baseline's, ended nothing, or it has no baseline (a finished run has a whole
    one, measured or reused)."""
    last = trace.baseline[-1] if trace.baseline else None
    return not trace.events or trace.events[-1].stop is None or last is None or last.stop is None


def explorer_refusal(trace: Trace | None, opened: bool = False) -> str | None:
    """Why the k explorer cannot replay this run (`opened`: from a trace file), or None when it
    can. A tree run is never replayed at other depths: the recording replays a chain drafter's
    guesses."""
    if trace is not None and (trace.settings.get("proposer") == "tree" or trace.stats.is_tree):
        return ("This run drafted token trees: the k explorer replays chain runs only (the draft model "
                "or the n-gram drafter), so tree runs are not replayed at other depths. Run the draft "
                "model at temperature 0 to explore k.")
    if trace is not None and trace.recording is None and trace.settings.get("temperature") == 0:
        proposer = trace.settings.get("proposer")  # a run the explorer replays, yet no recording:
        if proposer in EXPLORER_PROPOSERS and cut_short(trace):  # kept at the job's time limit, live
            # or opened (the recording is made at the end; its baseline, if any, kept as far as it went)
            return ("This run stopped at the job's time limit before it finished, and the k explorer's "
                    "recording is made at the end: run it again with fewer new tokens (or a shorter "
                    "prompt) to explore k.")
        if opened and proposer in EXPLORER_PROPOSERS:  # an opened trace whose "recording" is null (a
            # longer n-gram one is opened so: docs/trace-format.md)
            return ("This trace holds no recording (its \"recording\" is null), so the k explorer "
                    "cannot replay it: press Run to make the run again with its settings, then explore "
                    "k.")
        if proposer == "draft":  # explorer.record refused it
            return ("The draft model cannot read every token this run wrote, so the k explorer cannot "
                    "record its guesses: try the n-gram drafter to explore k.")
    if trace is None or trace.recording is None:
        return ("Run at temperature 0 with the draft model or n-gram drafter first (or open a trace): "
                "the explorer replays that run.")
    return None


class _Every:
    """True at most once per `seconds` (and on the first call). With `share`, the wait after a True
    is also at least what took() says the work it let through cost, over share (that work then
    takes at most that share of the time), up to `longest`."""

    def __init__(self, seconds: float, share: float | None = None, longest: float = float("inf")):
        self.seconds, self.share, self.longest = seconds, share, longest
        self.wait, self.last = seconds, -float("inf")

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.wait:
            return False
        self.last = now
        return True

    def took(self, seconds: float) -> None:
        if self.share:
            self.wait = max(self.seconds, min(seconds / self.share, self.longest))


def _prompt_ids(pair: Pair, s: RunSettings, limits: Limits) -> list[int]:
    """The prompt's ids (the chat setting applies only where the tokenizer has a template),
    at most limits.max_prompt_tokens of them."""
    ids = pair.encode(s.prompt, chat=s.chat and bool(getattr(pair.tokenizer, "chat_template", None)))
    if len(ids) > limits.max_prompt_tokens:
        raise ValueError(f"the prompt is {len(ids)} tokens; this deployment allows "
                         f"{limits.max_prompt_tokens} (operators: SPECVIZ_MAX_PROMPT_TOKENS): shorten it")
    return ids


def _when(measured_at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(measured_at))


def run_views(store: ModelStore, s: RunSettings, limits: Limits) -> Iterator[View]:
    """Load (if needed), stream the speculative run, then the baseline; ValueError on bad input.
    After a tree run, the chain drafter at the same k runs too, for the comparison.

    The baseline (and the chain) is reused when one with the same key (ModelStore.baseline_key,
    chain_key) was measured before. The job stops with a clear status once it has run
    limits.max_job_seconds (the clock starts when the pair is loaded).
    """
    s.check(limits, store.known_pairs)
    named = clip(s.target) if s.pair == CUSTOM else s.pair  # a long name clipped: its own "…" ends it
    loading = View(f"Loading {markdown_text(named)}{'' if named.endswith('…') else '…'}")
    pair = yield from store.loading(s, loading)
    if s.proposer in NEEDS_DRAFT and pair.draft is None:
        raise ValueError("this pair has no draft model: pick the n-gram drafter or 'none'")
    prompt_ids = _prompt_ids(pair, s, limits)
    deadline = time.monotonic() + limits.max_job_seconds
    kwargs = dict(k=s.k, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                  top_k=s.top_k, top_p=s.top_p, seed=s.seed)
    greedy = s.temperature == 0
    models = pair_models(pair)
    pieces_of = token_text(pair.tokenizer)  # one memo for the run's tree views
    views = dict(greedy=greedy, k=s.k, pieces_of=pieces_of, parts=_Parts())
    events, spans, context = [], [], list(prompt_ids)
    shown = _Every(VIEW_SECONDS)  # the rounds between two views show in the next
    plots = _Every(PLOT_SECONDS, RENDER_SHARE, PLOT_SECONDS_MAX)
    headline, sides = HEADLINE, _Every(SIDE_PLOT_SECONDS)  # beside the headline (the first: all)

    def live(status: str, spec: RunStats, base=None, comparison=None) -> View:
        """A view while the job streams: the plots, timeline and overview only when `plots` lets
        them be made again, paced by what they cost (time.perf_counter: a test's clock may move
        time.monotonic at each read), and of the plots only the phase's headline unless `sides`
        lets them (View.sides then holds the rounds that make the others)."""
        heavy, started = plots(), time.perf_counter()
        named = None if heavy and sides() else headline
        view = _view(status, pair, spans, spec, base, comparison, plots=heavy, figures=named, **views)
        if heavy:
            plots.took(time.perf_counter() - started)
        if heavy and named:  # the page keeps older plots beside this headline: what makes them
            view = replace(view, sides=Sides(spec, base, s.k))
        return view

    def kept(rounds, baseline=(), recording=None, chain=()) -> Trace:
        """The run's trace as far as it went (spans: every round shown so far)."""
        return Trace(asdict(s), models, prompt_ids, tuple(rounds), tuple(spans), tuple(baseline),
                     recording, tuple(chain), node_text(rounds, spans, pair.tokenizer))

    # an n-gram run keeps the price it starts with; the baseline below moves the target's line
    drafter = make_proposer(pair, "ngram") if s.proposer == "ngram" else s.proposer
    shape = dict(nodes=s.tree_nodes, branching=s.tree_branching) if s.proposer == "tree" else {}
    for event in generate(pair, prompt_ids, proposer=drafter, progress=True, **shape, **kwargs):
        if isinstance(event, Reading):  # a long prompt, a pass at a time: Stop and the limit act
            if time.monotonic() > deadline:
                yield View(_over_budget(limits, "the speculative run while it read the prompt (a "
                                                "shorter prompt reads faster)"))
                return
            yield View(_reading("Speculative run", event))
            continue
        events.append(event)
        spans += round_spans(event, pair.tokenizer, context)  # only this round's tokens decoded
        context += event.new_tokens
        if event.stop is None and time.monotonic() > deadline:
            trace = kept(events)
            made = len(context) - len(prompt_ids)
            yield replace(_view(_over_budget(limits, f"the speculative run after {made} tokens (no "
                                             "baseline)"), pair, spans, RunStats.of(events), kept=True,
                                **views), trace=trace)
            return
        if shown():
            yield live(f"Speculative run: round {event.round}", RunStats.of(events))
    spec, key = RunStats.of(events), store.baseline_key(pair, s, prompt_ids)
    views["pieces_of"] = ended = committed_pieces(events, spans, pieces_of)  # the end, as its text shows it
    if events:  # a last character left unfinished: its mark in the tree views while the baseline runs
        before = treeview.contexts(events)[-1]
        if ended(before, events[-1].new_tokens) != pieces_of(before, events[-1].new_tokens):
            views["parts"].forget("trees", "overview")
    if s.proposer == "draft":  # this run is what a tree run at this k compares with: keep it
        store.chains.put(store.chain_key(pair, s, prompt_ids), spec.events, time.time())
    reused = store.baselines.get(key)
    if reused is None:
        base_events = []
        headline, sides = RACE, _Every(SIDE_PLOT_SECONDS)
        for event in generate(pair, prompt_ids, proposer="none", progress=True, **kwargs):
            reading = isinstance(event, Reading)
            if not reading:
                base_events.append(event)
            if (reading or event.stop is None) and time.monotonic() > deadline:
                trace = kept(spec.events, base_events)  # the baseline as far as the view shows it
                made = "while it read the prompt" if reading else f"after {event.round} tokens"
                yield replace(_view(_over_budget(limits, f"the baseline {made} (no speedup or identity "
                                                 "check)"), pair, spans, spec,
                                    RunStats.of(base_events) if base_events else None, kept=True,
                                    **views), trace=trace)
                return
            if reading:
                yield _view(_reading("Baseline (target alone)", event), pair, spans, spec, plots=False,
                            **views)
                continue
            if shown():
                made = f"{event.round} token{'s' * (event.round > 1)}"
                yield live(f"Baseline (target alone): {made}", spec, RunStats.of(base_events))
        store.baselines.put(key, tuple(base_events), time.time())
        note = ""
    else:
        base_events, measured_at = reused
        note = (f" (baseline reused: the target alone with this pair, prompt and settings, "
                f"measured {_when(measured_at)})")
    base = RunStats.of(base_events)
    result = compare(spec, base, pair.dtype, pair.device, pair.numerics)
    pace = race_text(spec, base)
    if implausible := implausible_race(spec, base):  # timed under different loads: its baseline is
        store.baselines.drop(key)  # dropped, so that running again measures both anew (kept, every
        # later run reused its times)
        pace += (f" ({implausible}: the two runs were timed under different loads; run again for a fair "
                 "race (the baseline is measured again))")
    done = f"Done in {str(pair.dtype).removeprefix('torch.')}: {pace}{note}"
    status = f"{done}; greedy outputs {result.verdict}" if greedy else done
    chain = None
    if s.proposer == "tree":  # the chain drafter at the same depth, for the comparison
        key = store.chain_key(pair, s, prompt_ids)
        if (reused := store.chains.get(key)) is not None:
            chain = RunStats.of(reused[0])
            status += f" (chain comparison reused, measured {_when(reused[1])})"
        else:
            chain_events = []
            headline, sides = (), _Every(SIDE_PLOT_SECONDS)  # its rounds show in the finished view
            for event in generate(pair, prompt_ids, proposer="draft", progress=True, **kwargs):
                reading = isinstance(event, Reading)
                if (reading or event.stop is None) and time.monotonic() > deadline:
                    made = "while it read the prompt" if reading else \
                        f"after {event.position + len(event.new_tokens)} tokens"
                    status += ". " + _over_budget(limits, f"the chain comparison {made}")
                    break
                if reading:
                    yield _view(_reading(f"Chain drafter at k={s.k}, for the comparison", event), pair,
                                spans, spec, base, result, plots=False, **views)
                    continue
                chain_events.append(event)
                if shown():
                    yield live(f"Chain drafter at k={s.k}, for the comparison: round {event.round}",
                               spec, base, result)
            else:
                store.chains.put(key, tuple(chain_events), time.time())
                chain = RunStats.of(chain_events)
        if chain is not None:
            tree_, chain_ = spec.tokens_per_pass, chain.tokens_per_pass  # printed apart where they differ
            status += (f". Tokens per target pass: tree {beside(tree_, (1.0, chain_))}, chain at k={s.k} "
                       f"{beside(chain_, (1.0, tree_))}")
    view = _view(status, pair, spans, spec, base, result, chain=chain, kept=True, **views)
    recording = None
    if greedy and s.proposer in EXPLORER_PROPOSERS:
        try:
            recording = record(pair, prompt_ids, spec, s.proposer, s.max_new_tokens,
                               ngram_slope=getattr(drafter, "slope", None),
                               ngram_step=getattr(drafter, "step", None),
                               ngram_reads_on=getattr(drafter, "reads_on", None))
        except ValueError:  # a draft that cannot read every token: no k explorer for this run
            recording = None
        if recording is not None and recording.proposer == "ngram" and not ngram_replayable(
                len(prompt_ids), len(recording.output), recording.ngram_size):
            recording = None  # past what a saved trace's replay may cost (an operator's larger limits)
    yield replace(view, trace=kept(spec.events, base.events, recording,
                                   chain.events if chain is not None else ()))


def replay_view(trace: Trace, pair: Pair | None = None) -> View:
    """A saved run shown again without a model (its tree's texts read with the loaded pair's
    tokenizer when that pair made it, as the playback does: trace_text), with the figures the run
    showed: a tree run's chain comparison too, when the trace carries it."""
    spec, base = trace.stats, RunStats.of(trace.baseline) if trace.baseline else None
    chain = RunStats.of(trace.chain) if trace.chain else None
    greedy = float(trace.settings.get("temperature", 0)) == 0
    dtype = getattr(torch, str(trace.models.get("dtype", "float32")), torch.float32)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    # a run the job's time limit cut (run_views keeps it so): its baseline, where it has one, is
    # part of one, and the first difference found was where the shorter one ended ("unexplained")
    cut = bool(trace.events) and trace.events[-1].stop is None or base is not None and cut_short(trace)
    result = compare(spec, base, dtype, trace.models.get("device", ""),
                     trace.models.get("numerics") or "") if base and not cut else None  # older: none
    verdict = verdict_html(result, _NoTokenizer(trace, pair), greedy) if result else ""
    names = [markdown_text(public_message(clip(trace.models.get(m), 60))) for m in ("target", "draft")]
    k = trace.settings.get("k")
    number = treeview.fullest_round(spec.events)
    tree_html, overview = treeview.tree_views(spec.events, trace_text(trace, pair), number, greedy)
    ended = ("; the job's time limit stopped it before its end (no speedup or identity check)"
             if cut else "")
    return View(f"Replay of a saved run: {names[0]} with {names[1]}{ended}",
                to_html(list(trace.spans)), timeline_html(list(trace.spans), spec),
                stats_html(spec, base, chain), verdict,
                all_figures(spec, base, chain, k if type(k) is int else None), spec, base, result,
                trace, tree_html, number, overview, chain)


class _NoTokenizer:
    """Token text for views that would otherwise decode ids (the verdict's top-2): the loaded
    pair's tokenizer when that pair made the trace, as the live run decoded them; else each id as
    the trace holds it: the recording's token_text (an id decoded alone, as the live verdict
    decoded it), then the tree's node_text, then the spans' text (a piece read in its context).
    Without the pair no token has a name, so a token holding part of a character reads as the
    trace's text for it (U+FFFD), not by its bytes as the live verdict labels it."""

    def __init__(self, trace: Trace, pair: Pair | None = None):
        here = made_here(trace, pair)
        self.tokenizer, self.vocab_size = (pair.tokenizer, pair.vocab_size) if here else (None, 0)
        self.text = {s.token: s.text for s in trace.spans}
        recording = trace.recording
        for known in (trace.node_text, recording.token_text if recording else None):
            self.text.update({int(t): x for t, x in (known or {}).items()})

    def decode(self, ids):
        if self.tokenizer is not None and all(0 <= i < self.vocab_size for i in ids):
            return self.tokenizer.decode(ids)
        return "".join(self.text.get(i, f"⟨{i}⟩") for i in ids)

    def convert_ids_to_tokens(self, i: int) -> str | None:
        """A token's name (detok.token_label reads a partial character's bytes from it), where the
        pair that made the trace is loaded; None otherwise (the label is then the text)."""
        if self.tokenizer is not None and 0 <= i < self.vocab_size:
            return self.tokenizer.convert_ids_to_tokens(i)
        return None


def check_continuations(s: RunSettings, n: int, limits: Limits) -> None:
    """ValueError naming the fix for what the end-to-end check cannot sample: before the line and
    the load (at temperature 0 the refusal came after a switch to the page's pair or dtype)."""
    if not 10 <= n <= limits.max_samples:
        raise ValueError(f"samples must be in 10..{limits.max_samples} on this deployment "
                         "(operators: SPECVIZ_MAX_SAMPLES)")
    if s.temperature <= 0:
        raise ValueError("set a temperature above 0 (Run tab, Sampling; the check samples with the Run "
                         "tab's settings): at 0 every sample is the same")


E2E_MAX_DRAFTS = 4  # the end-to-end check's round 1 drafts at most this many (its GPU time: below)
E2E_FIX = f"take fewer samples, or a smaller k (a sample is min(k, {E2E_MAX_DRAFTS}) + 1 tokens)"


def e2e_tokens(s: RunSettings) -> int:
    """Tokens a sample of the end-to-end check draws: min(k, E2E_MAX_DRAFTS) + 1, so that round 1
    may draft that many (the budget caps a round's drafts: two tokens drafted one, whatever k, and
    no draft past the first, its residual or the rollback after it, was ever checked); 2 for the
    target alone, which drafts nothing. At most 5 tokens keeps 50 samples' ZeroGPU time within the
    120 s a day a visitor who is not signed in has (zerogpu.duration)."""
    return 2 if s.proposer == "none" else min(s.k, E2E_MAX_DRAFTS) + 1


def e2e_drafts(s: RunSettings, tokens: int) -> str:
    """How much round 1 of the check's samples drafts, in words (the page's note)."""
    if s.proposer == "none":
        return ""
    most = tokens - 1
    every = s.proposer == "draft" and most == s.k  # only the plain draft drafts its budget each round
    return f"round 1 drafts {'all' if every else 'up to'} {most}" + (
        "" if most == s.k else f" of k = {s.k}, the check's most")


def _e2e_tests(spec: Counter, base: Counter, tokens: int) -> tuple[list[dict], float, int]:
    """(tests, p-value, permutations) of the samples (token tuples; one cut short at an EOS reads
    -1 past it), seen as the joint histogram of the first two tokens and each later token's own
    (the joint of all k + 1 spreads over too many outcomes to see anything), in one permutation test
    (lab.joint_two_sample_tv). Each test: what, TV, noise, its own p-value, outcomes."""
    firsts: dict[tuple, int] = {}

    def rows(counts: Counter) -> torch.Tensor:  # [samples, tokens - 1]
        out = []
        for sample, c in counts.items():
            t = tuple(sample) + (-1,) * (tokens - len(sample))
            out += [[firsts.setdefault(t[:2], len(firsts)), *t[2:]]] * c
        return torch.tensor(out, dtype=torch.long)

    test = joint_two_sample_tv(rows(spec), rows(base))
    whats = ["tokens 1-2"] + [f"token {j + 1}" for j in range(2, tokens)]
    tests = [{"what": what, "tv": tv_, "noise": noise, "pvalue": p, "outcomes": m}
             for what, tv_, noise, p, m in zip(whats, test.tvs, test.noises, test.pvalues, test.outcomes,
                                               strict=True)]
    return tests, test.pvalue, test.permutations


def continuations(pair: Pair, s: RunSettings, n: int, limits: Limits | None = None,
                  tokens: int | None = None) -> Iterator[dict]:
    """n short samples (tokens each, unset: e2e_tokens) with and without speculation, as a
    stream: progress dicts {"done", "of"}, then the result {"final": True, histograms, tests, time},
    or {"stopped": message} when the job's time budget runs out; "seconds" maps "spec" and "base"
    to each run's time. "tests" (_e2e_tests) and, of the first (the first two tokens' joint),
    "tv", "noise" and "outcomes"; "pvalue": the one permutation test's over all of them.
    ValueError on bad input."""
    limits = limits or Limits()
    tokens = tokens or e2e_tokens(s)
    check_continuations(s, n, limits)
    if s.proposer in NEEDS_DRAFT and pair.draft is None:
        raise ValueError("this pair has no draft model: pick the n-gram drafter or 'none'")
    prompt_ids = _prompt_ids(pair, s, limits)
    room = round_room(s.proposer, s.k, s.tree_branching)
    pair.check_length(len(prompt_ids), tokens, room, drafted=s.proposer in NEEDS_DRAFT)
    deadline = time.monotonic() + limits.max_job_seconds
    kwargs = dict(k=s.k, max_new_tokens=tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    # One target cache and one draft cache for every sample: each reads only what the last one
    # left past the prompt (on this CPU the embedded pair's samples took 3.3-3.9 s, nearly all of
    # it the prompt, and 2 x 50 of them outran the 300 s job limit). A fresh drafter a sample, on
    # the kept draft cache: the n-gram, adaptive and tree drafters learn from their rounds, and
    # carried over they drafted differently from a run of their own. One untimed sample first
    # reads the prompt into both caches, so that neither run's time holds it.
    length = run_length(prompt_ids, tokens, room)
    target = target_lm(pair, length)
    draft = pair_draft_lm(pair, length) if s.proposer in NEEDS_DRAFT else None
    counts, seconds, done = {}, {}, 0
    # Keyed by run, not by drafter: with the drafter "none" both runs are the target alone.
    for run, name, seeds in (("prompt", s.proposer, [2 * 10**6]), ("spec", s.proposer, range(n)),
                             ("base", "none", range(10**6, 10**6 + n))):  # independent seeds
        start, c = time.perf_counter(), Counter()
        for seed in seeds:
            events = []
            proposer = make_proposer(pair, name, max_len=length, nodes=s.tree_nodes,
                                     branching=s.tree_branching, draft=draft)
            for event in generate(pair, prompt_ids, proposer=proposer, seed=seed, progress=True,
                                  target=target, **kwargs):
                if not isinstance(event, Reading):
                    events.append(event)
                elif time.monotonic() > deadline:  # a long prompt, read a pass at a time
                    what = f"the check after {done} of {2 * n} samples (a shorter prompt reads faster)"
                    yield {"stopped": _over_budget(limits, what, E2E_FIX), "done": done, "of": 2 * n}
                    return
                else:
                    yield {"done": done, "of": 2 * n, "method": name}  # Stop acts here too
            if run == "prompt":
                continue
            c[tuple(RunStats.of(events).tokens)] += 1
            done += 1
            if time.monotonic() > deadline and done < 2 * n:
                yield {"stopped": _over_budget(limits, f"the check after {done} of {2 * n} samples", E2E_FIX),
                       "done": done, "of": 2 * n}
                return
            yield {"done": done, "of": 2 * n, "method": name}  # Stop acts at each sample
        if run != "prompt":
            counts[run], seconds[run] = c, time.perf_counter() - start
    spec, base = counts["spec"], counts["base"]
    tests, pvalue, permutations = _e2e_tests(spec, base, tokens)
    first = tests[0]
    yield {"final": True, "samples": n, "tokens": tokens, "drafts": e2e_drafts(s, tokens), "tests": tests,
           "tv": first["tv"], "noise": first["noise"], "pvalue": pvalue, "permutations": permutations,
           "seconds": seconds, "spec": spec, "base": base, "outcomes": first["outcomes"]}

