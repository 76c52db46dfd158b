"""What the app runs: load pairs once, stream a speculative run then the baseline as views.

Plain values out (HTML strings, plotly figures); the app only wires them to components.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace

import torch

from . import presets
from .compare import Comparison, compare
from .engine import NEEDS_DRAFT, generate
from .explorer import EXPLORER_PROPOSERS, record
from .figures import all_figures
from .loading import Pair, load_pair
from .metrics import RunStats
from .render import round_spans, to_html
from .settings import CUSTOM, Limits, RunSettings
from .trace import Trace
from .views import stats_html, timeline_html, verdict_html


@dataclass(frozen=True)
class View:
    status: str
    text_html: str = ""
    timeline_html: str = ""
    stats_html: str = ""
    verdict_html: str = ""
    figures: dict = field(default_factory=dict)
    spec: RunStats | None = None
    base: RunStats | None = None
    comparison: Comparison | None = None
    trace: Trace | None = None


class ModelStore:
    """Holds one loaded pair at a time (memory), keyed by what was asked; loads under a lock."""

    def __init__(self, extra_pairs: dict[str, tuple[str, str | None]] | None = None,
                 device: str | None = None):
        self.extra_pairs = dict(extra_pairs or {})  # operator pairs from the command line
        self.device = device
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._pair: Pair | None = None

    @property
    def known_pairs(self) -> set[str]:
        return set(presets.BY_KEY) | set(self.extra_pairs)

    def key(self, s: RunSettings) -> tuple:
        names = (s.target.strip(), s.draft.strip() or None) if s.pair == CUSTOM else (s.pair,)
        return (s.pair, *names, s.dtype)

    def is_loaded(self, s: RunSettings) -> bool:
        return self._key == self.key(s)

    def current(self) -> Pair | None:
        """The pair loaded now, if any."""
        return self._pair

    def get(self, s: RunSettings) -> Pair:
        with self._lock:
            if self._key != self.key(s):
                self._pair = self._key = None  # free the old pair before loading the next
                dtype = None if s.dtype == "auto" else s.dtype
                if s.pair == CUSTOM:
                    pair = load_pair(s.target.strip(), s.draft.strip() or None, device=self.device,
                                     dtype=dtype)
                elif s.pair in self.extra_pairs:
                    target, draft = self.extra_pairs[s.pair]
                    pair = load_pair(target, draft, device=self.device, dtype=dtype)
                else:
                    pair = presets.load(s.pair, device=self.device, dtype=dtype)
                warm_up(pair)
                self._pair, self._key = pair, self.key(s)
            return self._pair


def warm_up(pair: Pair) -> None:
    """One short run so the first timed round does not pay for lazy initialisation."""
    list(generate(pair, [0, 1, 2], proposer="draft" if pair.draft is not None else "ngram",
                  k=2, max_new_tokens=3))


def _view(status, pair, spans, spec, base=None, comparison=None, greedy=True) -> View:
    return View(status, to_html(spans), timeline_html(spans, spec), stats_html(spec, base),
                verdict_html(comparison, pair.tokenizer, greedy), all_figures(spec, base),
                spec, base, comparison)


def _prompt_ids(pair: Pair, s: RunSettings) -> list[int]:
    """The prompt's ids; the chat setting applies only where the tokenizer has a template."""
    return pair.encode(s.prompt, chat=s.chat and bool(getattr(pair.tokenizer, "chat_template", None)))


def run_views(store: ModelStore, s: RunSettings, limits: Limits) -> Iterator[View]:
    """Load (if needed), stream the speculative run, then the baseline; ValueError on bad input."""
    s.check(limits, store.known_pairs)
    if not store.is_loaded(s):
        yield View(f"Loading {s.target if s.pair == CUSTOM else s.pair}…")
    pair = store.get(s)
    if s.proposer in NEEDS_DRAFT and pair.draft is None:
        raise ValueError("this pair has no draft model: pick the n-gram drafter or 'none'")
    prompt_ids = _prompt_ids(pair, s)
    kwargs = dict(k=s.k, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                  top_k=s.top_k, top_p=s.top_p, seed=s.seed)
    greedy = s.temperature == 0
    events, spans, context = [], [], list(prompt_ids)
    for event in generate(pair, prompt_ids, proposer=s.proposer, **kwargs):
        events.append(event)
        spans += round_spans(event, pair.tokenizer, context)  # only this round's tokens decoded
        context += event.new_tokens
        yield _view(f"Speculative run: round {event.round}", pair, spans, RunStats.of(events),
                    greedy=greedy)
    spec, base_events = RunStats.of(events), []
    for event in generate(pair, prompt_ids, proposer="none", **kwargs):
        base_events.append(event)
        if event.round % 4 == 0:
            yield _view(f"Baseline (target alone): {event.round} tokens", pair, spans, spec,
                        RunStats.of(base_events), greedy=greedy)
    base = RunStats.of(base_events)
    result = compare(spec, base, pair.dtype, pair.device)
    speedup = spec.tokens_per_second / max(base.tokens_per_second, 1e-9)
    view = _view(f"Done: {speedup:.2f}× the target alone; greedy outputs {result.verdict}"
                 if greedy else f"Done: {speedup:.2f}× the target alone", pair, spans, spec,
                 base, result, greedy)
    recording = None
    if greedy and s.proposer in EXPLORER_PROPOSERS:
        recording = record(pair, prompt_ids, spec, s.proposer, s.max_new_tokens)
    models = {"target": pair.target_name, "draft": pair.draft_name,
              "dtype": str(pair.dtype).removeprefix("torch."), "device": str(pair.device)}
    trace = Trace(asdict(s), models, prompt_ids, spec.events, tuple(spans), base.events, recording)
    yield replace(view, trace=trace)


def replay_view(trace: Trace) -> View:
    """A saved run shown again without a model."""
    spec, base = trace.stats, RunStats.of(trace.baseline) if trace.baseline else None
    greedy = float(trace.settings.get("temperature", 0)) == 0
    dtype = getattr(torch, str(trace.models.get("dtype", "float32")), torch.float32)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    result = compare(spec, base, dtype, trace.models.get("device", "")) if base else None
    verdict = verdict_html(result, _NoTokenizer(trace), greedy) if result else ""
    return View(f"Replay of a saved run: {trace.models.get('target')} with {trace.models.get('draft')}",
                to_html(list(trace.spans)), timeline_html(list(trace.spans), spec), stats_html(spec, base),
                verdict, all_figures(spec, base), spec, base, result, trace)


class _NoTokenizer:
    """Token text from a trace's spans, for views that would otherwise decode ids."""

    def __init__(self, trace: Trace):
        self.text = {s.token: s.text for s in trace.spans}

    def decode(self, ids):
        return "".join(self.text.get(i, f"⟨{i}⟩") for i in ids)


def sample_continuations(pair: Pair, s: RunSettings, n: int, tokens: int = 2) -> dict:
    """n short samples with and without speculation: histograms, TV distance, time."""
    if not 10 <= n <= 2000:
        raise ValueError("samples must be between 10 and 2000")
    if s.temperature <= 0:
        raise ValueError("set a temperature above 0: at 0 every sample is the same")
    prompt_ids = _prompt_ids(pair, s)
    kwargs = dict(k=s.k, max_new_tokens=tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    counts, seconds = {}, {}
    for proposer in (s.proposer, "none"):
        start, c = time.perf_counter(), Counter()
        offset = 0 if proposer == s.proposer else 10**6  # independent seeds for the two runs
        for seed in range(offset, offset + n):
            events = generate(pair, prompt_ids, proposer=proposer, seed=seed, **kwargs)
            c[tuple(RunStats.of(events).tokens)] += 1
        counts[proposer], seconds[proposer] = c, time.perf_counter() - start
    spec, base = counts[s.proposer], counts["none"]
    tv = 0.5 * sum(abs(spec[x] - base[x]) / n for x in set(spec) | set(base))
    return {"samples": n, "tv": tv, "seconds": seconds, "spec": spec, "base": base,
            "outcomes": len(set(spec) | set(base))}
