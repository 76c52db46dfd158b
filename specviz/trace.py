"""Run traces: save a run (settings, events, spans, stats, recording) as JSON and open it again
without any model loaded (Replay mode), e.g. to show a GPU run on a CPU-only Space.

Format "specviz-trace", version 1 (see docs/trace-format.md). Traces are data only: they are
checked field by field and size-capped, and nothing in them is ever executed or loaded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from .engine import RoundEvent
from .explorer import Recording
from .metrics import RunStats
from .render import LEGEND, Span

FORMAT, VERSION = "specviz-trace", 1
MAX_TRACE_BYTES = 20 * 2**20
MAX_ROUNDS = 20_000


@dataclass(frozen=True)
class Trace:
    settings: dict
    models: dict  # {"target": name, "draft": name, "dtype": ..., "device": ...}
    prompt_ids: list[int]
    events: tuple[RoundEvent, ...]
    spans: tuple[Span, ...]
    baseline: tuple[RoundEvent, ...] = ()
    recording: Recording | None = None

    @property
    def stats(self) -> RunStats:
        return RunStats.of(self.events)

    def __hash__(self) -> int:  # by identity: the app's state keeps traces, dict fields do not hash
        return id(self)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "settings": self.settings, "models": self.models,
            "prompt_ids": self.prompt_ids, "events": [asdict(e) for e in self.events],
            "baseline": [asdict(e) for e in self.baseline],
            "spans": [asdict(s) for s in self.spans], "summary": self.stats.summary(),
            "recording": self.recording.to_dict() if self.recording else None})


class TraceError(ValueError):
    pass


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise TraceError(f"not a valid specviz trace: {message}")


def _ints(value, what: str) -> list[int]:
    _expect(isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                            for v in value), f"{what} must be a list of integers")
    return value


_EVENT_TYPES = {"round": int, "k": int, "accepted": int, "token": int, "kind": str, "target_passes": int,
                "draft_passes": int, "draft_seconds": (int, float), "target_seconds": (int, float),
                "round_seconds": (int, float), "elapsed": (int, float), "position": int, "source": str,
                "target_cache_length": int}


def _event(d) -> RoundEvent:
    _expect(isinstance(d, dict), "each event must be an object")
    names = {f.name for f in fields(RoundEvent)}
    _expect(set(d) <= names and names - {"target_top2"} <= set(d),
            f"event fields differ from {sorted(names)}")
    for name, kind in _EVENT_TYPES.items():
        _expect(isinstance(d[name], kind) and not isinstance(d[name], bool), f"event {name} has a bad type")
    for name in ("draft_tokens", "new_tokens"):
        _ints(d[name], f"event {name}")
    for name in ("target_probs", "draft_probs"):
        _expect(isinstance(d[name], list) and all(isinstance(v, (int, float)) for v in d[name]),
                f"event {name} must be a list of numbers")
    _expect(d["stop"] in (None, "eos", "length"), "event stop must be null, 'eos' or 'length'")
    _expect(d["kind"] in ("recovered", "bonus"), "event kind must be 'recovered' or 'bonus'")
    top2 = d.get("target_top2", [])
    _expect(isinstance(top2, list) and all(isinstance(t, list) and len(t) <= 2 for t in top2),
            "event target_top2 must be a list of [id, logit] pairs")
    try:
        top2 = [[(int(i), float(v)) for i, v in t] for t in top2]
    except (TypeError, ValueError) as e:
        raise TraceError(f"not a valid specviz trace: event target_top2: {e}") from None
    return RoundEvent(**{**d, "target_top2": top2})


def _span(d) -> Span:
    _expect(isinstance(d, dict) and set(d) == {f.name for f in fields(Span)}, "bad span fields")
    _expect(isinstance(d["text"], str) and d["fate"] in LEGEND, "bad span text or fate")
    _expect(all(isinstance(d[n], int) for n in ("token", "round", "position")), "bad span numbers")
    _expect(all(d[n] is None or isinstance(d[n], (int, float)) for n in ("p", "q")), "bad span p/q")
    return Span(**d)


def _recording(d) -> Recording | None:
    if d is None:
        return None
    _expect(isinstance(d, dict) and set(d) <= {f.name for f in fields(Recording)}, "bad recording")
    try:
        rec = Recording(**{**d, "output_pieces": tuple(d.get("output_pieces", ())),
                           "guess_pieces": tuple(d.get("guess_pieces", ()))})
    except TypeError as e:
        raise TraceError(f"not a valid specviz trace: recording: {e}") from None
    _expect(rec.proposer in ("draft", "ngram"), "recording proposer must be draft or ngram")
    for name in ("prompt_ids", "output", "guesses"):
        _ints(getattr(rec, name), f"recording {name}")
    _expect(isinstance(rec.max_new_tokens, int) and isinstance(rec.ngram_size, int)
            and 1 <= rec.ngram_size <= 16, "recording numbers")
    _expect(rec.proposer == "ngram" or len(rec.guesses) == len(rec.output), "recording lengths")
    _expect(all(isinstance(p, str) for p in rec.output_pieces + rec.guess_pieces), "recording pieces")
    _expect(isinstance(rec.confidences, (list, tuple)) and len(rec.confidences) in (0, len(rec.output))
            and all(isinstance(c, (int, float)) and 0 <= c <= 1 for c in rec.confidences),
            "recording confidences must be probabilities, one per output token")
    return rec


def loads(text: str | bytes) -> Trace:
    """Parse and check a trace; TraceError (a ValueError) names what is wrong."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"trace is {len(text) / 2**20:.1f} MiB; the limit is "
                         f"{MAX_TRACE_BYTES // 2**20} MiB")
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"not a valid specviz trace: not JSON ({e})") from None
    _expect(isinstance(d, dict) and d.get("format") == FORMAT, f'"format" must be "{FORMAT}"')
    _expect(d.get("version") == VERSION, f"version {d.get('version')!r} is not supported (this "
                                         f"specviz reads version {VERSION})")
    _expect(isinstance(d.get("settings"), dict) and isinstance(d.get("models"), dict),
            "settings and models must be objects")
    events, baseline, spans = d.get("events"), d.get("baseline", []), d.get("spans")
    _expect(isinstance(events, list) and events and len(events) <= MAX_ROUNDS,
            f"events must be a non-empty list of at most {MAX_ROUNDS}")
    _expect(isinstance(baseline, list) and len(baseline) <= MAX_ROUNDS, "baseline must be a list")
    _expect(isinstance(spans, list), "spans must be a list")
    return Trace(d["settings"], d["models"], _ints(d.get("prompt_ids"), "prompt_ids"),
                 tuple(_event(e) for e in events), tuple(_span(s) for s in spans),
                 tuple(_event(e) for e in baseline), _recording(d.get("recording")))
