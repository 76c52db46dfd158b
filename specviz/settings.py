"""The app's settings, its share-link query string, and the operator's limits."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from urllib.parse import urlencode

from . import presets
from .engine import PROPOSERS

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."
UI_MAX_K = 16
CUSTOM = "custom"
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Limits:
    """Set by whoever deploys the app, never by a page or a link."""

    allow_custom: bool = False  # SPECVIZ_ALLOW_CUSTOM_MODELS=1
    max_prompt_chars: int = 4000  # SPECVIZ_MAX_PROMPT_CHARS
    max_new_tokens: int = 512  # SPECVIZ_MAX_NEW_TOKENS

    @classmethod
    def from_env(cls) -> Limits:
        return cls(os.environ.get("SPECVIZ_ALLOW_CUSTOM_MODELS", "0") in ("1", "true", "yes"),
                   _env_int("SPECVIZ_MAX_PROMPT_CHARS", 4000), _env_int("SPECVIZ_MAX_NEW_TOKENS", 512))


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
            out["pair"] = f"unknown pair {self.pair[:60]!r}: pick one from the list"
        if self.proposer not in PROPOSERS:
            out["proposer"] = f"unknown drafter {self.proposer[:30]!r}: use {', '.join(PROPOSERS)}"
        if not 1 <= self.k <= UI_MAX_K:
            out["k"] = f"k must be in 1..{UI_MAX_K}, got {self.k}"
        if not self.temperature >= 0:
            out["temperature"] = f"temperature must be >= 0 (0 is greedy), got {self.temperature}"
        if not 0 < self.top_p <= 1:
            out["top_p"] = f"top_p must be in (0, 1], got {self.top_p}"
        if self.top_k < 0:
            out["top_k"] = f"top_k must be >= 0 (0 turns it off), got {self.top_k}"
        if not self.prompt.strip():
            out["prompt"] = "the prompt is empty: type some text or pick an example"
        elif len(self.prompt) > limits.max_prompt_chars:
            out["prompt"] = (f"the prompt has {len(self.prompt)} characters; this deployment "
                             f"allows {limits.max_prompt_chars}: shorten it")
        if self.dtype not in DTYPES:
            out["dtype"] = f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype[:20]!r}"
        if not 1 <= self.max_new_tokens <= limits.max_new_tokens:
            out["max_new_tokens"] = (f"max new tokens must be in 1..{limits.max_new_tokens}, "
                                     f"got {self.max_new_tokens}")
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
        return urlencode(values)


_TYPES = {f.name: f.type for f in fields(RunSettings)}
_BOOL = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
         "off": False}


def from_query(params: dict[str, str], base: RunSettings, limits: Limits,
               known_pairs) -> tuple[RunSettings, list[str], bool]:
    """Settings from a link's query parameters: (settings, notices, run). Never raises."""
    notices, changes = [], {}
    run = str(params.get("run", "")).lower() in ("1", "true", "yes")
    for key, raw in params.items():
        if key in ("run", "__theme"):
            continue
        if key not in _TYPES:
            notices.append(f"ignored unknown link parameter {key!r}")
            continue
        kind = _TYPES[key]
        try:
            if kind == "bool":
                value = _BOOL[str(raw).lower()]
            elif kind == "int":
                value = int(raw)
            elif kind == "float":
                value = float(raw)
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError
            else:
                value = str(raw)
        except (KeyError, ValueError):
            notices.append(f"ignored link parameter {key}={str(raw)[:40]!r}: not a valid {kind}")
            continue
        changes[key] = value
    if "target" in changes or "draft" in changes:
        if not limits.allow_custom:
            notices.append("ignored target/draft from the link: custom models are disabled here")
            changes.pop("target", None), changes.pop("draft", None)
        elif "pair" not in changes:
            changes["pair"] = CUSTOM
    settings = replace(base, **changes)
    for key, message in settings.problems(limits, known_pairs).items():
        notices.append(f"ignored link parameter {key}: {message}")
        settings = replace(settings, **{key: getattr(base, key)})
        if key == "pair":
            settings = replace(settings, target=base.target, draft=base.draft)
    return settings, notices, run
