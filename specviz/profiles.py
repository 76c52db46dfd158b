"""Cost profiles: what one draft pass and one target pass cost on some hardware, per code path.

A profile is the JSON that `python -m specviz gpucheck` writes. It lets a recorded run be
replayed onto other hardware: the rounds of a run fix how many draft passes it made and how
many tokens each target pass verified, so its time on a profile is

    seconds = draft passes * C_D + sum over rounds of C_T(tokens verified)

(on a compiled path C_T at the width the engine pads the pass to: see fed), with C_T
interpolated linearly over the measured verify widths (extrapolated along the last segment past
the widest). Round 1 also carries the prompt, a width no step is compiled for, so each model's
first pass runs eager: on a compiled path it is priced at the profile's eager path (the target's
at its verify width, the run's widest, where the line is measured; the draft's at eager C_D). A
profile has no prefill cost beyond that: the prompt's length is not priced (on a GPU an eager pass
is overhead-bound, so that is close; on a CPU it underestimates).

Format (version 1; see docs/benchmarks.md, "GPU check and cost profiles"):

    {"format": "specviz-costs", "version": 1, "name": "nvidia-h200-bfloat16", "created": "2026-11-30",
     "quick": false, "note": "...",
     "hardware": {"device": "cuda", "name": "NVIDIA H200", "memory_gib": 139.8, "cpus": 16,
                  "copy_gbs": 4300.0},
     "packages": {"torch": "2.11.0", "transformers": "5.17.0", "python": "3.12.3", "cuda": "13.0"},
     "models": {"target": {"name": "...", "params": 1777088000, "weight_bytes": 3554176000,
                           "dtype": "bfloat16"}, "draft": {...}},
     "paths": {"eager": {"cache": "dynamic", "compiled": false, "draft_ms": 8.1,
                         "target_ms": {"1": 9.0, "2": 9.1, "5": 9.3}},
               "fast": {"cache": "static", "compiled": true, "draft_ms": 1.1, "target_ms": {...}}}}

Profiles are data a user may upload: `load` checks every field (known keys only, bounded
numbers and strings) and raises ValueError naming the field.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import untrusted as u
from .lm import bucket
from .treedraft import MAX_NODES

FORMAT, VERSION = "specviz-costs", 1
SHIPPED = Path(__file__).parent.parent / "assets" / "profiles"
MAX_BYTES = 64 << 10
MAX_MS = 1e6  # a pass slower than 1000 s is not a measurement
MAX_WIDTH = 1 + MAX_NODES  # widest verify a profile may hold: a full tree's nodes and the root's token
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

TOP_KEYS = {"format", "version", "name", "created", "quick", "note", "hardware", "packages", "models",
            "paths"}
HARDWARE = {"device": str, "name": str, "memory_gib": float, "cpus": int, "copy_gbs": float}
PACKAGES = {"torch", "transformers", "python", "cuda"}
MODEL = {"name": str, "params": int, "weight_bytes": int, "dtype": str, "config": str}
PATH = {"cache", "compiled", "dtype", "max_len", "draft_ms", "target_ms", "note"}


@dataclass(frozen=True)
class PathCosts:
    """One code path's pass costs: C_D and C_T at each measured verify width (milliseconds)."""
    cache: str  # "dynamic" or "static"
    compiled: bool
    draft_ms: float | None  # one 1-token draft pass (None: measured without a draft)
    target_ms: tuple[tuple[int, float], ...]  # (verify width, ms), widths ascending, width 1 first
    dtype: str = ""
    max_len: int | None = None
    note: str = ""

    def target_seconds(self, width: int) -> float:
        """C_T(width) in seconds: linear between measured widths, along the last segment past them."""
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"a verify width is a positive integer, got {width!r}")
        ws = [w for w, _ in self.target_ms]
        ms = [m for _, m in self.target_ms]
        if width in ws:
            return ms[ws.index(width)] / 1e3
        if width > ws[-1]:
            if len(ws) == 1:
                return ms[0] / 1e3
            slope = max(0.0, (ms[-1] - ms[-2]) / (ws[-1] - ws[-2]))
            return (ms[-1] + slope * (width - ws[-1])) / 1e3
        i = next(i for i, w in enumerate(ws) if w > width)
        t = (width - ws[i - 1]) / (ws[i] - ws[i - 1])
        return (ms[i - 1] + t * (ms[i] - ms[i - 1])) / 1e3

    @property
    def draft_seconds(self) -> float | None:
        return None if self.draft_ms is None else self.draft_ms / 1e3

    def to_dict(self) -> dict:
        return {"cache": self.cache, "compiled": self.compiled, "dtype": self.dtype, "max_len": self.max_len,
                "draft_ms": self.draft_ms, "target_ms": {str(w): m for w, m in self.target_ms},
                "note": self.note}


@dataclass(frozen=True)
class Profile:
    name: str
    hardware: dict
    packages: dict
    paths: dict[str, PathCosts]
    models: dict = field(default_factory=dict)
    created: str = ""
    quick: bool = False
    note: str = ""

    @property
    def label(self) -> str:
        """One line for a menu or a report: name, hardware, packages."""
        p = self.packages
        quick = " (quick: tiny widths, the real depths)" if self.quick else ""
        return (f"{self.name}: {self.hardware.get('name', '?')}, torch {p.get('torch', '?')}, "
                f"transformers {p.get('transformers', '?')}{quick}")

    @property
    def measured(self) -> str:
        """The models whose passes the profile timed, in words ("" where it names no target): a
        run of another pair is priced at their costs, not its own."""
        def named(role: str) -> str | None:
            m = self.models.get(role)
            if not isinstance(m, dict) or not isinstance(m.get("name"), str):
                return None
            return m["name"] + (f" ({m['dtype']})" if isinstance(m.get("dtype"), str) else "")
        target, draft = named("target"), named("draft")
        return "" if target is None else f"the target {target}" + (f"; the draft {draft}" if draft else "")

    def path_label(self, name: str) -> str:
        """A path's name with what it ran: "fast (static cache, compiled)". On a CPU the "fast"
        path is the static cache uncompiled, and can be slower than eager: the label says so.
        "graphed" (ZeroGPU's): steps captured as CUDA graphs without a compiler."""
        c = self.path(name)
        steps = ", captured steps" if name == "graphed" else ", compiled" if c.compiled else ""
        return f"{name} ({c.cache} cache{steps})"

    def path(self, name: str) -> PathCosts:
        if name not in self.paths:
            raise ValueError(f"profile {self.name!r} has no {str(name)[:20]!r} path: "
                             f"pick one of {', '.join(self.paths)}")
        return self.paths[name]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "name": self.name, "created": self.created,
                "quick": self.quick, "note": self.note, "hardware": self.hardware, "packages": self.packages,
                "models": self.models, "paths": {n: p.to_dict() for n, p in self.paths.items()}}


# ---- validation: a profile is hostile input ------------------------------------------------

def _text(value, where: str, limit: int = 200) -> str:
    return u.text(value, where, limit, printable=True)


def _number(value, where: str, lo: float, hi: float, integer: bool = False) -> float | int:
    return u.integer(value, where, int(lo), int(hi)) if integer else u.number(value, where, lo, hi)


def _flag(value, where: str) -> bool:
    if type(value) is not bool:
        u.fail(where, "must be true or false")
    return value


def _path(name: str, raw) -> PathCosts:
    where = f"paths.{name}"
    raw = u.keys(raw, where, PATH)
    cache = raw.get("cache", "dynamic")
    if cache not in ("dynamic", "static"):
        u.fail(f"{where}.cache", "must be 'dynamic' or 'static'")
    compiled = _flag(raw.get("compiled", False), f"{where}.compiled")
    draft = raw.get("draft_ms")
    draft = None if draft is None else _number(draft, f"{where}.draft_ms", 1e-6, MAX_MS)
    widths = u.keys(raw.get("target_ms"), f"{where}.target_ms", [str(w) for w in range(1, MAX_WIDTH + 1)])
    costs = sorted((int(w), _number(ms, f"{where}.target_ms.{w}", 1e-6, MAX_MS)) for w, ms in widths.items())
    if not costs or costs[0][0] != 1:
        u.fail(f"{where}.target_ms", 'must hold width "1" (the target alone)')
    max_len = raw.get("max_len")
    max_len = None if max_len is None else _number(max_len, f"{where}.max_len", 1, 1 << 24, integer=True)
    return PathCosts(cache, compiled, draft, tuple(costs), _text(raw.get("dtype", ""), f"{where}.dtype", 20),
                     max_len, _text(raw.get("note", ""), f"{where}.note", 300))


def from_dict(raw) -> Profile:
    """A checked profile from a parsed JSON value; ValueError naming the field."""
    try:
        return _profile(raw)
    except u.Invalid as e:
        raise ValueError(f"profile field {e}") from None


def _profile(raw) -> Profile:
    raw = u.keys(raw, "(top level)", TOP_KEYS)
    if raw.get("format") != FORMAT or type(raw.get("version")) is not int or raw.get("version") != VERSION:
        raise ValueError(f"not a cost profile: format must be {FORMAT!r} and version {VERSION}")
    name = _text(raw.get("name"), "name", 64)
    if not NAME.match(name):
        u.fail("name", "must be lower-case letters, digits, '.', '_' or '-' (at most 64)")
    hardware = u.keys(raw.get("hardware"), "hardware", HARDWARE)
    hw = {key: (_text(hardware[key], f"hardware.{key}", 100) if kind is str else
                _number(hardware[key], f"hardware.{key}", 0, 1e7, integer=kind is int))
          for key, kind in HARDWARE.items() if hardware.get(key) is not None}
    packages = {k: v if v is None else _text(v, f"packages.{k}", 60)
                for k, v in u.keys(raw.get("packages"), "packages", PACKAGES).items()}
    models = {}
    for role, model in u.keys(raw.get("models", {}), "models", ("target", "draft")).items():
        model = u.keys(model, f"models.{role}", MODEL)
        models[role] = {k: (_text(v, f"models.{role}.{k}", 200) if MODEL[k] is str else
                            _number(v, f"models.{role}.{k}", 0, 1e15, integer=True))
                        for k, v in model.items()}
    paths = raw.get("paths")
    if type(paths) is not dict or not 1 <= len(paths) <= 8 \
            or not all(isinstance(n, str) and NAME.match(n) for n in paths):
        u.fail("paths", "must map 1..8 path names (e.g. eager, fast) to their costs")
    return Profile(name, hw, packages, {n: _path(n, p) for n, p in paths.items()}, models,
                   _text(raw.get("created", ""), "created", 40), _flag(raw.get("quick", False), "quick"),
                   _text(raw.get("note", ""), "note", 500))


def load(source: str | Path | bytes | dict) -> Profile:
    """A profile from a file path, JSON text/bytes or a parsed dict; ValueError naming the field."""
    if not isinstance(source, (str, Path, bytes)):
        return from_dict(source)  # a parsed value: refused unless it is a well-formed object
    text = isinstance(source, str) and (source.lstrip()[:1] in ("{", "[") or len(source) > 4096)
    if isinstance(source, Path) or (isinstance(source, str) and not text):
        path = Path(source)
        try:
            with path.open("rb") as f:  # one byte past the limit at most: a special file (/dev/zero)
                source = f.read(MAX_BYTES + 1)  # reports size 0 and may never end
        except OSError as e:
            raise ValueError(f"cannot read the cost profile {path.name[:60]!r}: {e.strerror}") from None
    size = len(source)  # text in the bytes it saves as, as a file's (its characters undercounted "é")
    if size <= MAX_BYTES and isinstance(source, str):
        size = len(source.encode("utf-8", "replace"))
    if size > MAX_BYTES:
        raise ValueError(f"a cost profile is at most {MAX_BYTES >> 10} KiB")
    try:
        raw = json.loads(source)
    except (ValueError, RecursionError):
        raise ValueError("a cost profile must be JSON") from None
    return from_dict(raw)


def save(profile: Profile, path: str | Path) -> Path:
    """Write a profile as JSON (validated first: what is saved loads back)."""
    data = profile.to_dict()
    from_dict(json.loads(json.dumps(data)))
    path = Path(path)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def shipped(folder: Path = SHIPPED) -> list[str]:
    """Names of the profiles shipped in assets/profiles/ (measured, never made up)."""
    return sorted(p.stem for p in folder.glob("*.json") if NAME.match(p.stem))


def load_shipped(name: str, folder: Path = SHIPPED) -> Profile:
    """A shipped profile by name (a menu's value: only names in `shipped()` are accepted)."""
    if not isinstance(name, str) or name not in shipped(folder):
        raise ValueError(f"no shipped cost profile {str(name)[:40]!r}: "
                         f"pick one of {', '.join(shipped(folder)) or '(none shipped)'}")
    return load(folder / f"{name}.json")


# ---- projection -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Passes:
    """What a run asked of the models: draft passes, and target passes by tokens verified."""
    draft: int
    widths: dict[int, int]  # verify width (k+1) -> target passes of that width
    tree: bool = False  # widths are 1 + nodes of token trees (padded on a compiled path)
    k: int = 0  # the run's k: a compiled path feeds a chain verify of 2..k tokens padded to k+1
    # (lm.CachedLM.forward); 0: unknown, each pass priced at its own width

    @property
    def target(self) -> int:
        return sum(self.widths.values())


def passes_of(run) -> Passes:
    """Passes of an explorer Replay or Point, a sequence of engine RoundEvents, or a Passes."""
    if isinstance(run, Passes):
        return run
    if hasattr(run, "widths") and hasattr(run, "draft_passes"):  # explorer.Point
        return Passes(run.draft_passes, dict(run.widths), k=run.k)
    if hasattr(run, "rounds") and hasattr(run, "recording"):  # explorer.Replay
        k = run.k if isinstance(run.k, int) else run.k_max  # adaptive: the live run pads to k_max + 1
        return Passes(run.draft_passes, dict(Counter(r.k + 1 for r in run.rounds)), k=k)
    events = list(run)
    if events and not all(hasattr(e, "k") and hasattr(e, "draft_passes") for e in events):
        raise ValueError("project() takes a k-explorer replay, a run's round events or a Passes")
    draft = events[-1].draft_passes if events else 0  # cumulative in RoundEvent
    # a round verifies its last token and its drafts: k of a chain, every node of a tree. The
    # events do not hold the run's k: their widest chain stands for it (at most the setting)
    return Passes(draft, dict(Counter(getattr(e, "nodes", e.k) + 1 for e in events)),
                  any(getattr(e, "tree", ()) for e in events), max((e.k for e in events), default=0))


def fed(width: int, passes: Passes, compiled: bool) -> int:
    """Tokens a target pass of `width` verified tokens feeds: on a compiled path a tree's nodes
    are padded to lm.bucket, a chain of 2..k tokens to k + 1; elsewhere as many as it verified.
    (A tree round that drafted nothing, the run's last say, is a plain 1-token pass.)"""
    if not compiled or width == 1:
        return width
    if passes.tree:
        return 1 + bucket(width - 1)
    return passes.k + 1 if width <= passes.k else width


def project(run, profile: Profile, path: str = "fast", first_round: bool = True) -> float:
    """Seconds the run would take on `profile`'s `path`: draft passes * C_D + sum of C_T(width).
    On a compiled path a tree pass feeds its nodes padded to lm.bucket(nodes): C_T(1 + bucket);
    a chain verify of 2..k tokens is padded to the run's k + 1: C_T(k + 1). There each model's
    first pass, round 1's over the prompt, runs eager: priced at the "eager" path where the profile
    has one (the target's at the run's widest verify width, round 1's in a chain run); not where
    the passes are rounds after round 1 (first_round False)."""
    costs = profile.path(path)
    passes = passes_of(run)
    if passes.draft and costs.draft_seconds is None:
        raise ValueError(f"profile {profile.name!r} has no draft cost on its {path!r} path")
    target = sum(n * costs.target_seconds(fed(w, passes, costs.compiled)) for w, n in passes.widths.items())
    seconds = target + passes.draft * (costs.draft_seconds or 0.0)
    eager = profile.paths.get("eager")
    if first_round and costs.compiled and eager is not None and not eager.compiled and passes.widths:
        first = max(passes.widths)
        seconds += eager.target_seconds(first) - costs.target_seconds(fed(first, passes, True))
        if passes.draft and eager.draft_seconds is not None:
            seconds += eager.draft_seconds - costs.draft_seconds
    return seconds


def extrapolated(run, profile: Profile, path: str = "fast") -> bool:
    """Whether project() prices some target pass of the run past the widest width the path
    measured (PathCosts.target_seconds: along its last two widths, or flat at a single one, which
    prices verifying as free): an estimate, as gpucheck's projection marks its rows."""
    costs, passes = profile.path(path), passes_of(run)
    widest = costs.target_ms[-1][0]
    return any(fed(w, passes, costs.compiled) > widest for w in passes.widths)


# Tokens per target pass T(k) of each drafter, greedy, on the embedded pair: the "all" row (8
# prompts, 2 repeats, 64 tokens, prefill pass counted) of docs/bench-cpu-2026-11-30.json,
# summary["specviz:<drafter>"]["all"]["tokens_per_pass"]. They depend on the models and the
# text, not the hardware, so a GPU run of the same pair drafts alike. (The specviz draft rows ran
# an int4 draft; transformers' bf16 draft reached 3.93 at k=4 against 3.90.) The n-gram row is
# the first bench that kept each run's verify widths, docs/bench-hf-cpu-2026-12-07.json (8 chat
# prompts, 64 tokens): 453 tokens in 311 passes (the 2026-11-30 bench reached 1.4675).
CPU_TOKENS_PER_PASS = {"draft-1": 1.8745, "draft-2": 2.6199, "draft-3": 3.2701, "draft-4": 3.8957,
                       "draft-6": 5.0337, "draft-8": 6.0541, "ngram-8": 453 / 311}

# An n-gram round verifies what its lookup found, from nothing (a 1-token pass) to k: its target
# passes by width, summed over the records["widths"] of specviz:ngram-8 in the same file.
CPU_ROUND_WIDTHS = {"ngram-8": {1: 66, 2: 11, 3: 17, 4: 14, 5: 25, 6: 22, 7: 31, 8: 16, 9: 109}}


def projection(profile: Profile, path: str, rates: dict[str, float] = CPU_TOKENS_PER_PASS,
               widths: dict[str, dict[int, int]] = CPU_ROUND_WIDTHS) -> list[dict]:
    """Per drafter: time per token (k * C_D + C_T(k+1)) / T(k) and the speedup over C_T(1);
    "extrapolated" where a pass is wider than any the path measured (PathCosts.target_seconds).

    A drafter with measured round widths (the n-gram's: no draft pass, and a verify of whatever its
    lookup found) is priced per width instead: the mean of C_T over its passes, each fed as the
    path feeds it (`fed`: a compiled path pads 2..k tokens to k + 1, a round that drafted nothing
    stays a 1-token pass). A path without a draft cost has no draft-model rows (priced at no draft
    time they would overstate it)."""
    costs = profile.path(path)
    alone = costs.target_seconds(1)
    widest = max(w for w, _ in costs.target_ms)
    rows = []
    for drafter, tokens in rates.items():
        k = int(drafter.rsplit("-", 1)[1])
        model = drafter.startswith("draft")
        if model and costs.draft_seconds is None:
            continue
        draft = k * costs.draft_seconds if model else 0.0
        passes = Passes(0, widths.get(drafter) or {k + 1: 1}, k=k)
        fed_widths = {w: fed(w, passes, costs.compiled) for w in passes.widths}
        verify = sum(n * costs.target_seconds(fed_widths[w]) for w, n in passes.widths.items())
        verify /= passes.target  # the mean target pass
        per_token = (draft + verify) / tokens
        rows.append({"drafter": drafter, "k": k, "tokens_per_pass": tokens, "ms_per_token": per_token * 1e3,
                     "tokens_per_second": 1 / per_token, "speedup": alone / per_token,
                     "extrapolated": max(fed_widths.values()) > widest})  # priced past the widest measured
    return rows
