"""The app's settings, its share-link query string, and the operator's limits.

Everything a page, a link or an API call sends arrives here as untrusted values: `settings_from`
coerces them (ValueError with a message otherwise) and `RunSettings.problems` bounds them.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, fields, replace
from urllib.parse import urlencode

from . import presets, zerogpu
from .engine import PROPOSERS
from .gate import proxy_networks
from .treedraft import BRANCHING, MAX_BRANCHING, MAX_NODES
from .untrusted import env_flag, flag, is_utf8, visible_bidi

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."
UI_MAX_K = 16
CUSTOM = "custom"
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_TEMPERATURE = 2.0  # the app's slider; also keeps logits / temperature finite
MIN_TEMPERATURE = 0.01  # above 0 (greedy), smaller temperatures overflow the softmax
MAX_TOP_K = 2**20
MAX_SEED = 2**32 - 1
SHOWN_CHARS = 40  # of a visitor's text echoed in a notice or message


# The most an operator may allow: a saved trace holds at most these (tracecheck), so a run past them
# would save a file that Open refuses.
TRACE_MAX_NEW_TOKENS = 4096
TRACE_MAX_PROMPT_CHARS = 100_000
TRACE_MAX_PROMPT_TOKENS = 2**20 - TRACE_MAX_NEW_TOKENS  # of the 2^20 positions a trace's run may hold


def _env_number(name: str, default, lo, kind, hi=None):
    """An operator's limit: unset or blank, the default; raised to lo; ValueError naming the
    variable for a value that is not a number (a typo stops start-up, not a limit silently), or
    one over hi (what a saved trace can hold)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        word = "a whole number" if kind is int else "a number"
        raise ValueError(f"{name}={clip(raw)!r} is not {word}: give one (default {default:g}) or "
                         "unset it")
    if hi is not None and value > hi:
        raise ValueError(f"{name}={clip(raw)!r} is over {hi}, the most a saved trace holds (Save "
                         f"would write files that Open refuses): give at most {hi}")
    return max(lo, value)


def _env_int(name: str, default: int, lo: int = 1, hi: int | None = None) -> int:
    return _env_number(name, default, lo, int, hi)


def _env_float(name: str, default: float, lo: float = 1.0) -> float:
    return _env_number(name, default, lo, float)


@dataclass(frozen=True)
class Limits:
    """Set by whoever deploys the app, never by a page or a link."""

    allow_custom: bool = False  # SPECVIZ_ALLOW_CUSTOM_MODELS=1
    max_prompt_chars: int = 4000  # SPECVIZ_MAX_PROMPT_CHARS
    max_new_tokens: int = 512  # SPECVIZ_MAX_NEW_TOKENS (unset on ZeroGPU: zerogpu.MAX_NEW_TOKENS)
    max_prompt_tokens: int = 2048  # SPECVIZ_MAX_PROMPT_TOKENS: after encoding (unusual text is dense)
    max_samples: int = 200  # SPECVIZ_MAX_SAMPLES: the end-to-end histogram check, per method
    max_job_seconds: float = 300.0  # SPECVIZ_MAX_JOB_SECONDS: model time one job may hold
    allow_large: bool | None = False  # SPECVIZ_ALLOW_LARGE_MODELS (None, unset: by the machine's memory)
    queue_size: int = 16  # SPECVIZ_QUEUE_SIZE: model jobs waiting or running, all visitors
    max_sessions: int = 1000  # SPECVIZ_MAX_SESSIONS: visitors whose page state the server keeps
    held_trace_mb: int = 256  # SPECVIZ_HELD_TRACE_MB: memory of all traces held for visitors
    jobs_per_address: int = 2  # SPECVIZ_JOBS_PER_ADDRESS: model jobs one public address may hold
    upload_mb: int = 512  # SPECVIZ_UPLOAD_MB: uploads all visitors may leave in the cache at once
    max_download_gb: float = 20.0  # SPECVIZ_MAX_DOWNLOAD_GB: what a model typed in may download
    trust_forwarded: tuple = proxy_networks(None)  # SPECVIZ_TRUST_FORWARDED: proxies whose
    # X-Forwarded-For names the visitor (default: loopback, and on a Space 10.0.0.0/8; 0: none)
    dtypes: tuple = DTYPES  # offered on this deployment (the app on a CPU: for_device drops float16)

    def for_device(self, device: str) -> Limits:
        """These limits for the device the models run on: on a CPU no float16, whose matrix products
        run there 10-100x slower than bfloat16's (one long prompt's first pass held the model 9 minutes)."""
        return replace(self, dtypes=tuple(d for d in DTYPES if d != "float16")) if device == "cpu" else self

    def fit(self, s: RunSettings) -> RunSettings:
        """s within these limits where a default may exceed them (an operator's lower token or
        prompt bound): every page load would otherwise say the defaults were ignored."""
        return replace(s, max_new_tokens=min(s.max_new_tokens, self.max_new_tokens),
                       prompt=s.prompt[: self.max_prompt_chars],
                       dtype=s.dtype if s.dtype in self.dtypes else "auto")

    @classmethod
    def from_env(cls) -> Limits:
        return cls(bool(env_flag("SPECVIZ_ALLOW_CUSTOM_MODELS")),
                   _env_int("SPECVIZ_MAX_PROMPT_CHARS", 4000, hi=TRACE_MAX_PROMPT_CHARS),
                   _env_int("SPECVIZ_MAX_NEW_TOKENS", zerogpu.MAX_NEW_TOKENS if zerogpu.active() else 512,
                            hi=TRACE_MAX_NEW_TOKENS),
                   _env_int("SPECVIZ_MAX_PROMPT_TOKENS", 2048, hi=TRACE_MAX_PROMPT_TOKENS),
                   _env_int("SPECVIZ_MAX_SAMPLES", 200, 10),
                   _env_float("SPECVIZ_MAX_JOB_SECONDS", 300.0),
                   presets.large_flag(),
                   _env_int("SPECVIZ_QUEUE_SIZE", 16), _env_int("SPECVIZ_MAX_SESSIONS", 1000, 10),
                   _env_int("SPECVIZ_HELD_TRACE_MB", 256, 32), _env_int("SPECVIZ_JOBS_PER_ADDRESS", 2),
                   _env_int("SPECVIZ_UPLOAD_MB", 512, 8), _env_float("SPECVIZ_MAX_DOWNLOAD_GB", 20.0, 0.1),
                   trusted_proxies())


def trusted_proxies() -> tuple:
    """The proxies SPECVIZ_TRUST_FORWARDED names (gate.proxy_networks: by default loopback, and on
    a Space, SPACE_ID, its proxy's 10.0.0.0/8). ValueError where uvicorn trusts every peer's
    X-Forwarded-For (FORWARDED_ALLOW_IPS=*): it then hands the app the header's leftmost entry as
    the visitor's address, which the visitor writes, and no per-address limit holds."""
    if "*" in [host.strip() for host in os.environ.get("FORWARDED_ALLOW_IPS", "").split(",")]:
        raise ValueError("FORWARDED_ALLOW_IPS=* lets a visitor pick the address it is counted as "
                         "(uvicorn takes the leftmost X-Forwarded-For entry, which the visitor writes), so "
                         "no per-address limit holds: unset it, and name your proxies in "
                         "SPECVIZ_TRUST_FORWARDED (specviz reads X-Forwarded-For itself)")
    return proxy_networks(os.environ.get("SPECVIZ_TRUST_FORWARDED"), space=bool(os.environ.get("SPACE_ID")))


def clip(value, n: int = SHOWN_CHARS) -> str:
    """A visitor's text shortened for echoing back: at most n characters, then an ellipsis."""
    text = str(value)
    return text if len(text) <= n else text[: n - 1] + "…"


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~:/=\"'])")


_PATH = re.compile(r"(?<![\w.:~/-])(?:~|/)[^\s'\"()<>,;]*")


def public_message(text: str) -> str:
    """A message fit for any visitor: server paths shortened to their last part (…/name)."""
    def short(m: re.Match) -> str:
        if m.string[m.start() - 1:m.start()] == "…" and "/" not in m.group(0)[1:]:
            return m.group(0)  # "…/name": shortened already (a saved trace's names, shown again)
        last = m.group(0).rstrip("/.").rsplit("/", 1)[-1]
        return f"…/{last}" if last and last != "~" else "…"

    return _PATH.sub(short, str(text))


def markdown_text(text: str) -> str:
    """Plain text for a gr.Markdown: HTML and Markdown (links, images, emphasis) show as typed, and
    bidirectional controls as ⟨U+XXXX⟩."""
    return _MARKDOWN.sub(r"\\\1", html.escape(visible_bidi(str(text)), quote=False))


@dataclass(frozen=True)
class RunSettings:
    pair: str = presets.EMBEDDED  # a preset key, or "custom" (target/draft below)
    target: str = ""
    draft: str = ""
    proposer: str = "draft"
    k: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_new_tokens: int = 64
    prompt: str = DEFAULT_PROMPT
    chat: bool = True
    dtype: str = "auto"  # "auto" (per device), "float32", "bfloat16", "float16"
    nodes: int = 0  # the token tree's nodes per round: 0 sizes it each round from the verify cost
    branching: int = 0  # the token tree: children of each expanded node (0: from 3, widened as it fills)

    @property
    def tree_nodes(self) -> int | None:
        """generate's `nodes`: None (0 here) sizes each round's tree from the measured cost."""
        return self.nodes or None

    @property
    def tree_branching(self) -> int | None:
        """generate's `branching`: None (0 here) widens the tree while it fills."""
        return self.branching or None

    def problems(self, limits: Limits, known_pairs) -> dict[str, str]:
        """{field: message naming the fix} for anything a user can get wrong."""
        out = {}
        if self.pair == CUSTOM:
            if not limits.allow_custom:
                out["pair"] = ("custom models are disabled on this deployment: pick a preset pair "
                               "(operators: set SPECVIZ_ALLOW_CUSTOM_MODELS=1)")
            elif not self.target.strip():
                out["target"] = "custom pair: type a target model (hub id or local path)"
        elif self.pair not in known_pairs:
            out["pair"] = f"unknown pair {clip(self.pair)!r}: pick one from the list"
        elif self.pair in presets.BY_KEY and \
                (why := presets.availability(presets.BY_KEY[self.pair], limits.allow_large)) is not None:
            out["pair"] = f"{self.pair} cannot load on this deployment ({why}): pick another pair"
        elif (why := presets.too_large(self.pair, limits.allow_large, self.dtype)) is not None:
            out["dtype"] = (f"{self.pair} in {self.dtype} needs twice the memory ({why}): pick "
                            "bfloat16 or auto")
        if self.proposer not in PROPOSERS:
            out["proposer"] = f"unknown drafter {clip(self.proposer)!r}: use {', '.join(PROPOSERS)}"
        if not 1 <= self.k <= UI_MAX_K:
            out["k"] = f"k must be in 1..{UI_MAX_K}, got {clip(self.k)}"
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            out["temperature"] = (f"temperature must be 0 (greedy) or in {MIN_TEMPERATURE}.."
                                  f"{MAX_TEMPERATURE:g}, got {clip(self.temperature)}")
        if not 0 < self.top_p <= 1:
            out["top_p"] = f"top_p must be in (0, 1], got {clip(self.top_p)}"
        if not 0 <= self.top_k <= MAX_TOP_K:
            out["top_k"] = f"top_k must be in 0..{MAX_TOP_K} (0 turns it off), got {clip(self.top_k)}"
        if not 0 <= self.seed <= MAX_SEED:
            out["seed"] = f"seed must be in 0..{MAX_SEED}, got {clip(self.seed)}"
        if not self.prompt.strip():
            out["prompt"] = "the prompt is empty: type some text or pick an example"
        elif len(self.prompt) > limits.max_prompt_chars:
            out["prompt"] = (f"the prompt has {len(self.prompt)} characters; this deployment "
                             f"allows {limits.max_prompt_chars}: shorten it")
        if not 0 <= self.nodes <= MAX_NODES:
            out["nodes"] = (f"tree nodes must be in 0..{MAX_NODES} (0 sizes each round's tree from the "
                            f"measured verify cost), got {clip(self.nodes)}")
        if not 0 <= self.branching <= MAX_BRANCHING:
            out["branching"] = (f"tree branching must be in 0..{MAX_BRANCHING} (0 widens the tree from "
                                f"{BRANCHING} children while it fills), got {clip(self.branching)}")
        if self.dtype not in DTYPES:
            out["dtype"] = f"dtype must be one of {', '.join(DTYPES)}, got {clip(self.dtype)!r}"
        elif self.dtype not in limits.dtypes:
            out["dtype"] = (f"{self.dtype} is not offered on this deployment (on a CPU its matrix products "
                            f"run 10-100x slower than bfloat16's): pick one of {', '.join(limits.dtypes)}")
        if not 1 <= self.max_new_tokens <= limits.max_new_tokens:
            out["max_new_tokens"] = (f"max new tokens must be in 1..{limits.max_new_tokens}, "
                                     f"got {clip(self.max_new_tokens)}")
        return out

    def check(self, limits: Limits, known_pairs) -> None:
        problems = self.problems(limits, known_pairs)
        if problems:
            raise ValueError(next(iter(problems.values())))

    def to_query(self) -> str:
        """The share-link query string: preset as pair=..., custom as target=/draft=."""
        values = asdict(self)
        if self.pair == CUSTOM:
            values.pop("pair")
        else:
            values.pop("target"), values.pop("draft")
        values["chat"] = int(self.chat)
        if self.dtype == "auto":
            values.pop("dtype")
        if self.proposer != "tree":  # a chain link stays short; a tree link names both knobs
            for name, default in (("nodes", 0), ("branching", 0)):
                if values[name] == default:
                    values.pop(name)
        return urlencode(values)


_TYPES = {f.name: f.type for f in fields(RunSettings)}


# The page's address carries these for Gradio and Hugging Face Spaces, not for specviz: the theme,
# and the signature a Space adds to its app's address (Gradio's own share link deletes it there)
HOSTS_OWN = ("__theme", "__sign")


def from_query(params, base: RunSettings, limits: Limits,
               known_pairs) -> tuple[RunSettings, list[str], bool]:
    """Settings from a link's query parameters (a mapping, or a request's QueryParams with every
    repeat): (settings, notices, run). Never raises.

    A parameter given twice is ignored (which one would count is a guess: a long link could show
    one prompt near its start and run another at its end); a site's own parameter given twice (a
    re-shared link's fbclid) is no setting and, like one given once, leaves run=1 as it is.
    run=1 starts the run only when every setting the link gives was taken: a refused one would
    leave the page's default in its place, a run the visitor never asked for (on a ZeroGPU Space,
    paid from their quota).
    Notices quote the visitor's names and values clipped to SHOWN_CHARS; they are plain text
    (escape them where they become HTML or Markdown: markdown_text).
    """
    items = list(params.multi_items() if hasattr(params, "multi_items") else params.items())
    given = Counter(key for key, _ in items)
    twice = {key: f"ignored link parameter {clip(key)!r}: given {n} times; give it once"
             for key, n in given.items() if n > 1 and key not in HOSTS_OWN}
    notices = [text for key, text in twice.items() if key in _TYPES or key == "run"]
    once = {key: raw for key, raw in items if given[key] == 1 and key not in HOSTS_OWN}
    run = flag(str(once.pop("run", "0")).strip())
    if run is None:
        notices.append("ignored link parameter run: it must be 1 (run on opening) or 0")
    unknown = [f"ignored unknown link parameter {clip(key)!r}" for key in once if key not in _TYPES]
    unknown += [text for key, text in twice.items() if key not in _TYPES and key != "run"]  # a site's own
    settings, refused = _merged({key: raw for key, raw in once.items() if key in _TYPES}, base, limits,
                                known_pairs, "link parameter")
    notices += refused
    if run and notices:
        notices.append("the link's run=1 was not acted on: fix the parameters named above and press Run")
    return settings, notices + unknown, bool(run) and not notices


def from_trace(settings: dict, base: RunSettings, limits: Limits,
               known_pairs) -> tuple[RunSettings, list[str]]:
    """The settings an opened trace was run with, for the page's controls: (settings, notices).
    Never raises. Each value is read as a link's would be, and one this deployment does not
    allow (a pair it lacks, more new tokens than it gives) keeps base's, with a notice."""
    def as_text(value):  # JSON's types in the share link's words; anything else is refused
        if isinstance(value, bool):
            return "1" if value else "0"
        return str(value) if isinstance(value, (int, float, str)) else None
    custom = settings.get("pair") == CUSTOM  # its target/draft name it; a preset's are blank
    raw = {key: as_text(value) for key, value in settings.items()
           if key not in (("pair",) if custom else ("target", "draft"))}
    return _merged(raw, base, limits, known_pairs, "trace setting")


def _merged(params: dict, base: RunSettings, limits: Limits, known_pairs,
            what: str) -> tuple[RunSettings, list[str]]:
    """base with params' values (text, as a link sends them; None for a value of no type),
    each problem named in a notice and left at base's value."""
    notices, changes = [], {}

    def kept(key: str) -> str:  # what the page shows in the refused value's place
        value = getattr(base, key)  # as a link writes it: a switch 1 or 0, a text quoted and clipped
        if isinstance(value, str):
            return f" (kept {clip(value, 40)!r})"
        return f" (kept {int(value) if isinstance(value, bool) else value})"

    for key, raw in params.items():
        if key not in _TYPES:
            notices.append(f"ignored unknown {what} {clip(key)!r}")
            continue
        if raw is None:
            notices.append(f"ignored {what} {key}: not a valid {_TYPES[key]}{kept(key)}")
            continue
        kind = _TYPES[key]
        try:
            if kind == "bool":
                value = flag(raw)
                if value is None:
                    raise ValueError
            elif kind == "int":  # as the page and the API read them: 4.0 is 4
                value = _int(key, raw)
            elif kind == "float":
                value = _float(key, raw)
            else:
                value = str(raw)
        except ValueError as e:
            notices.append((f"ignored {what} {key}: {e}" if kind != "bool" else
                            f"ignored {what} {key}={clip(raw)!r}: it must be 1 or 0 (true or false)")
                           + kept(key))
            continue
        changes[key] = value
    if "target" in changes or "draft" in changes:
        if not limits.allow_custom:
            source = "the link" if what == "link parameter" else "the trace"
            notices.append(f"ignored target/draft from {source}: custom models are disabled here; "
                           "pick a pair from the list")
            changes.pop("target", None), changes.pop("draft", None)
        elif "pair" not in changes:
            changes["pair"] = CUSTOM
    settings = replace(base, **changes)
    for key, message in settings.problems(limits, known_pairs).items():
        models = [k for k in ("target", "draft") if getattr(settings, k) != getattr(base, k)]
        if key in ("target", "draft") and settings.pair == CUSTOM != base.pair:
            # the custom pair this link asked for (by its pair or its model names) has no usable
            # model: it goes back to base's pair whole, named by what the link gave
            first, *rest = [k for k in ("pair", "target", "draft") if k in params]
            notices.append(f"ignored {what} {first}: {message}{kept('pair')}")
            notices += [f"ignored {what} {k}: it goes with the custom pair refused above" for k in rest]
        elif key == "pair" and models:  # a refused pair takes the link's model names with it
            notices.append(f"ignored {what} pair: {message}{kept('pair')}")
            notices += [f"ignored {what} {k}: it goes with the pair refused above" for k in models]
        elif key in ("target", "draft") and key not in changes:
            continue  # base's own, put back with the pair above
        else:
            notices.append(f"ignored {what} {key}: {message}{kept(key)}")
            settings = replace(settings, **{key: getattr(base, key)})
            continue
        settings = replace(settings, pair=base.pair, target=base.target, draft=base.draft)
    return settings, notices


def _int(name: str, value, default: int | None = None) -> int:
    if value is None:
        if default is None:
            raise ValueError(f"{name} is missing: set a value")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a whole number, got {clip(type(value).__name__)}")
    if isinstance(value, str):
        if len(value) > 30:  # no setting's number is that long (nor a link's, typed or pasted)
            raise ValueError(f"{name} must be a whole number of at most 30 characters, got {clip(value)!r}")
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be a whole number, got {clip(value)!r}") from None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} must be a whole number, got {clip(value)}")
    return int(value)


def _float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number, got {clip(type(value).__name__)}")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {clip(value)!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {clip(value)}")
    return number + 0.0  # -0.0 is 0.0: a link's "temperature=-0" is shared on as "0"


def _text(name: str, value, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, got {clip(type(value).__name__)}")
    if len(value) > limit:
        raise ValueError(f"{name} has {len(value)} characters; this deployment allows {limit}: shorten it")
    if not is_utf8(value):  # a lone surrogate: no tokenizer takes it
        raise ValueError(f"{name} holds a lone surrogate (a half of a UTF-16 pair, not text): "
                         "retype or paste it again")
    return value


def _bool(name: str, value) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    if isinstance(value, str) and (switch := flag(value)) is not None:
        return switch
    raise ValueError(f"{name} must be true or false, got {clip(value)!r}")


def coerce_int(name: str, value, lo: int, hi: int, default: int | None = None) -> int:
    """A whole number in lo..hi from whatever a page or API call sent; ValueError naming the fix."""
    number = _int(name, value, default)
    if not lo <= number <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {clip(number)}")
    return number


MAX_NAME_CHARS = 1000  # a text setting other than the prompt: a custom pair's target and draft


def page_query_bound(limits: Limits) -> int:
    """The characters a page's query may have (a share link's, which carries its settings): each
    character of the prompt, and of a custom pair's two model names where custom pairs are
    allowed, is at most 12 percent-encoded (%XX of 4 UTF-8 bytes), and 4,096 more hold the rest."""
    names = 2 * MAX_NAME_CHARS if limits.allow_custom else 0
    return 12 * (limits.max_prompt_chars + names) + 4096


def settings_from(values: dict, limits: Limits) -> RunSettings:
    """RunSettings from raw values (a page, an API call): right types, or ValueError naming the fix.

    Ranges are RunSettings.problems' business; this only makes every field the right type, so
    that nothing downstream meets None, NaN, a list or a 10**30 where it expects a number.
    """
    v = dict(values)
    text_limit = max(limits.max_prompt_chars, 1000)
    out = {name: _text(name, v.get(name), text_limit if name == "prompt" else MAX_NAME_CHARS)
           for name in ("pair", "target", "draft", "proposer", "prompt", "dtype")}
    for name in ("pair", "proposer"):
        if not out[name]:
            raise ValueError(f"{name} is missing: pick one from the list")
    out["dtype"] = out["dtype"] or "auto"
    out["k"] = _int("k", v.get("k"))
    out["top_k"], out["seed"] = _int("top_k", v.get("top_k"), 0), _int("seed", v.get("seed"), 0)
    out["max_new_tokens"] = _int("max new tokens", v.get("max_new_tokens"))
    out["nodes"] = _int("tree nodes", v.get("nodes"), 0)
    out["branching"] = _int("tree branching", v.get("branching"), 0)
    out["temperature"] = _float("temperature", 0.0 if v.get("temperature") is None else v["temperature"])
    out["top_p"] = _float("top_p", 1.0 if v.get("top_p") is None else v["top_p"])
    out["chat"] = _bool("chat", False if v.get("chat") is None else v["chat"])
    return RunSettings(**out)
