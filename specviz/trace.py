"""Run traces: save a run (settings, events, spans, stats, recording) as JSON and open it again
without any model loaded (Replay mode), e.g. to show a GPU run on a CPU-only Space.

Format "specviz-trace", version 1 (see docs/trace-format.md). Traces are data only: they are
checked field by field (tracecheck.py) and size-capped, and nothing in them is ever executed or
loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from . import untrusted
from .engine import RoundEvent
from .explorer import Recording
from .metrics import RunStats
from .render import Span
from .tracecheck import FORMAT, MAX_DEPTH, MAX_TRACE_BYTES, MAX_VOCAB, VERSION, fields_of

__all__ = ["MAX_TRACE_BYTES", "Trace", "TraceError", "check_model", "loads", "mib_over"]


@dataclass(frozen=True)
class Trace:
    settings: dict
    models: dict  # {"target": name, "draft": name, "dtype": ..., "device": ..., "numerics": ...}
    prompt_ids: list[int]
    events: tuple[RoundEvent, ...]
    spans: tuple[Span, ...]
    baseline: tuple[RoundEvent, ...] = ()
    recording: Recording | None = None
    chain: tuple[RoundEvent, ...] = ()  # a tree run's comparison: the chain drafter at the same k
    node_text: dict[str, str] | None = None  # id -> text alone of every tree-node token

    @property
    def stats(self) -> RunStats:
        return RunStats.of(self.events)

    def __hash__(self) -> int:  # by identity, so a trace can key a dict or join a set: its dict
        # fields do not hash
        return id(self)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "settings": self.settings, "models": self.models,
            "prompt_ids": self.prompt_ids, "events": [_event_dict(e) for e in self.events],
            "baseline": [_event_dict(e) for e in self.baseline],
            "spans": [asdict(s) for s in self.spans], "summary": self.stats.summary(),
            "recording": self.recording.to_dict() if self.recording else None,
            **({"chain": [_event_dict(e) for e in self.chain]} if self.chain else {}),
            **({"node_text": self.node_text} if self.node_text else {})},
            separators=(",", ":"), ensure_ascii=False)  # UTF-8: an emoji's 4 bytes, not 12 escaped


def _event_dict(e: RoundEvent) -> dict:
    """A chain round keeps the shape it had before trees (no "tree" key), so its traces still
    open in readers that predate trees; a tree round adds "tree", a list of node objects."""
    d = asdict(e)
    if not e.tree:
        del d["tree"]
        return d
    # A tree round carries up to 64 nodes: its probabilities are float32 values, which 9
    # significant digits carry exactly (not 17). A 64-node round still takes about 9 KB, so a tree
    # run of 64-node rounds reaches the 4 MiB cap near 450 new tokens (Save refuses a larger one).
    for node in d["tree"]:
        node.update((name, _short(node[name])) for name in ("p", "q", "score"))
    d["target_probs"] = [_short(x) for x in d["target_probs"]]
    d["draft_probs"] = [_short(x) for x in d["draft_probs"]]
    return d


def _short(x: float) -> float:
    return float(f"{x:.9g}")


class TraceError(ValueError):
    pass


def mib_over(n: int) -> float:
    """n bytes in MiB to one decimal, rounded up: a file just over the 4 MiB limit never reads
    "4.0 MiB; the limit is 4 MiB"."""
    return math.ceil(n / 2**20 * 10) / 10


def _reject_constant(name: str):
    raise TraceError(f"not a valid specviz trace: {name} is not a number JSON allows")


def loads(text: str | bytes, vocab_size: int | None = None, max_positions: int | None = None) -> Trace:
    """Parse and check a trace; TraceError (a ValueError) names the field that is wrong.

    Every field is typed and bounded (tracecheck's limits); token ids must be below vocab_size
    when given, else below MAX_VOCAB; with max_positions, prompt and output must fit.
    """
    if isinstance(text, str):
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise TraceError("not a valid specviz trace: not JSON (a lone surrogate)") from None
    elif isinstance(text, (bytes, bytearray)):
        data = bytes(text)
    else:
        raise TraceError(f"not a valid specviz trace: expected JSON text, got {type(text).__name__}")
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"trace is {mib_over(len(data))} MiB; the limit is "
                         f"{MAX_TRACE_BYTES // 2**20} MiB")
    if not untrusted.is_utf8_json(data):
        raise TraceError("not a valid specviz trace: not UTF-8 JSON (specviz writes traces in "
                         "UTF-8; save it again in that encoding)")
    if untrusted.depth(data) > MAX_DEPTH:
        raise TraceError(f"not a valid specviz trace: nested deeper than {MAX_DEPTH} levels")
    vocab = MAX_VOCAB if vocab_size is None else vocab_size
    with untrusted.gc_paused():
        try:
            d = json.loads(data, parse_constant=_reject_constant)
        except TraceError:
            raise
        except RecursionError:
            raise TraceError("not a valid specviz trace: nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, and the int-digits limit
            raise TraceError(f"not a valid specviz trace: not JSON ({str(e)[:200]})") from None
        try:
            untrusted.integer(vocab, "vocab_size", 1, 2**31)
            t = Trace(**fields_of(d, vocab))
        except untrusted.Invalid as e:
            raise TraceError(f"not a valid specviz trace: {e}") from None
        except (TypeError, KeyError, IndexError, AttributeError, ValueError, OverflowError,
                RecursionError) as e:  # a check missed: still refuse, never crash the caller
            raise TraceError(f"not a valid specviz trace: malformed ({type(e).__name__})") from None
    if max_positions is not None:
        check_model(t, vocab, max_positions)
    return t


def check_model(t: Trace, vocab_size: int, max_positions: int | None = None) -> None:
    """Refuse an opened trace that does not fit a model, before feeding its ids to one: every id
    a model would read below vocab_size, and prompt plus output within max_positions."""
    runs = (t.events, t.baseline, t.chain)
    top = max([max(t.prompt_ids)] + [max(e.new_tokens + e.draft_tokens + [n.token for n in e.tree])
                                     for run in runs for e in run])
    if top >= vocab_size:
        raise TraceError(f"this trace holds token id {top}, outside the model's vocabulary of "
                         f"{vocab_size}: it was made with another tokenizer")
    # a round at output position g feeds the last committed token and its nodes: P + g + nodes
    longest = len(t.prompt_ids) + max(e.position + e.nodes for run in runs for e in run)
    if max_positions is not None and longest > max_positions:
        raise TraceError(f"this trace needs up to {longest} positions; the model has {max_positions}: "
                         "read it with the model that made it, or one with that many positions")
