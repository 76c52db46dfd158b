"""load_pair: a target (and optional draft) from a hub id, a local folder, or a .gguf file.

Never enables trust_remote_code. Checks that draft and target tokenize alike before any run.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import torch

from . import dense, quant, zerogpu
from .arch import check_rollback, output_rows, positions, tree_window
from .lm import first_line
from .untrusted import clip, whole

EMPTY_PROMPT = "the prompt is empty: type some text to continue"
_PROBE = ["def fibonacci(n):\n    return n", "Hello, world! Ünïcödé 東京 🙂", "  \t\n x = [1, 2]"]


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def check_device(device: str) -> str:
    """A device this torch can use, else a ValueError naming the fix (before any model loads)."""
    try:
        kind, index = torch.device(device).type, torch.device(device).index
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"unknown device {device!r} ({str(e).splitlines()[0][:120]}): use cpu, cuda "
                         "or mps") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU for this torch here; use cpu (or leave "
                         "--device out for the best available)")
    if kind == "cuda" and index is not None and index >= (count := torch.cuda.device_count()):
        raise ValueError(f"device {device!r}: this machine has {count} CUDA GPU{'s' * (count != 1)}: "
                         f"use cuda:0{f'..cuda:{count - 1}' if count > 1 else ''} (or plain cuda)")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r}: MPS is not available here; use cpu")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {device!r}: specviz runs on cpu, cuda or mps")
    return device


def default_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA and CPU, fp16 on MPS. (On a CPU without bf16 instructions float32 makes
    speculation pay, for twice the memory: README, "dtype on CPU".)"""
    return torch.float16 if device == "mps" else torch.bfloat16


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:  # torch.int8 reached transformers, which refused it mid-load
            raise ValueError(f"dtype {dtype} is no floating-point type: use float32, bfloat16 or float16 "
                             "(an int4 or int8 draft is draft_quant's)")
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return names[dtype]


@dataclass(frozen=True)
class Pair:
    target: object  # a transformers causal LM
    tokenizer: object  # the target's tokenizer (the draft's maps strings to the same ids)
    draft: object | None = None
    target_name: str = "target"
    draft_name: str | None = None
    chat_default: bool = False  # instruct models: apply the chat template by default
    refine: bool = True  # recompute the target's top logits in float32 (see lm.refine_top)
    fast: str = "auto"  # fastpath.FAST_PATHS: auto (the default), eager, static cache, static + compiled
    # steps, or graphed (ZeroGPU: captured inside the call)

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    @cached_property
    def vocab_size(self) -> int:
        """The target's vocabulary: ids both the tokenizer and the target know (rows past the
        tokenizer are embedding padding, masked). p is always over all of it; a draft that knows
        fewer ids gives the rest zero mass in q (see ModelProposer)."""
        return min(len(self.tokenizer), output_rows(self.target))

    @cached_property
    def eos_ids(self) -> frozenset[int]:
        eos = self.target.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)

    @property
    def max_positions(self) -> int | None:
        return positions(self.target)

    @cached_property
    def tree_window(self) -> int | None:
        """The positions a token tree stays exact below on both models (None: any; arch.tree_window:
        sliding-window models whose tree masks cannot give each layer its window); ValueError for
        caches that cannot roll back. Chains have no such bound: a sliding-window model's cache
        keeps every position (kvcache.full_layers) and crops exactly past its window."""
        models = [(self.target, self.target_name)]
        if self.draft is not None:
            models.append((self.draft, self.draft_name or "the draft"))
        for model, name in models:
            check_rollback(model, name)
        return min((w for w in (tree_window(m) for m, _ in models) if w), default=None)

    @property
    def numerics(self) -> str:
        """What the greedy verdict compares: the target's arithmetic, said plainly."""
        from .arch import refinable

        dtype = str(self.dtype).removeprefix("torch.")
        head = (", final projection's top logits recomputed in float32"
                if self.refine and refinable(self.target) else "")
        return f"target in {dtype}{head} on {self.device}; raw logits, no generation_config processors"

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        """A str prompt through the tokenizer (chat template if chat), or ids as they are. With chat,
        special tokens typed in the prompt are text; without, the tokenizer reads them as tokens."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(EMPTY_PROMPT)
            if chat:
                if not getattr(self.tokenizer, "chat_template", None):
                    raise ValueError(f"{self.target_name} has no chat template: turn chat off")
                # what is typed in a message is its text: "<|im_end|>" typed ended the message and
                # could open a system turn (chat off, typed special tokens are read, as for FIM)
                from jinja2 import TemplateError, TemplateSyntaxError

                try:
                    ids = self.tokenizer.apply_chat_template(
                        [{"role": "user", "content": prompt}], add_generation_prompt=True,
                        tokenize=True, return_dict=False, sanitize_control_tokens=True)
                except TemplateError as e:  # a template's raise_exception ("roles must alternate"):
                    # not a ValueError, so the page said a bare "Error" and the CLI a traceback
                    said = first_line(e)
                    what = "does not parse" if isinstance(e, TemplateSyntaxError) else "refused the prompt"
                    raise ValueError(f"{self.target_name}'s chat template {what} "
                                     f"({said[:120]}): turn chat off") from None
                if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                    ids = ids["input_ids"]
                ids = [int(i) for i in ids]
            else:
                ids = [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=True)]
            if not ids:  # whitespace is text like any other; what encodes to nothing is not
                raise ValueError(EMPTY_PROMPT)
        else:
            ids = token_ids(prompt)
        # every id the target reads: on a GPU one past its embedding is a device-side assert that
        # fails every later job of the process (a tokenizer longer than the target's vocabulary)
        if (bad := next((i for i in ids if not 0 <= i < self.vocab_size), None)) is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"prompt token ids must be in 0..{self.vocab_size - 1}, got {bad}: pass ids "
                                 "of this pair's tokenizer (pair.encode(text))")
            raise ValueError(f"the tokenizer gave token id {bad}, past the {self.vocab_size} ids "
                             f"{self.target_name} reads: pick a target that shares its tokenizer")
        return ids

    def check_length(self, prompt_tokens: int, max_new_tokens: int, room: int,
                     drafted: bool = False) -> None:
        """room: the most positions a round may add to a cache beyond the output (a chain's k;
        a token tree's nodes). drafted: the draft model reads the run
        too, so its positions bound it as well (a learned-position draft shorter than the target
        failed mid-run with an IndexError)."""
        models = [(self.target_name, self.max_positions, "")]
        if drafted and self.draft is not None:
            models.append((self.draft_name or "the draft", positions(self.draft),
                           ", or pick the n-gram drafter"))
        for name, limit, other in models:
            if limit and prompt_tokens + max_new_tokens - 1 > limit:  # the last token is never fed
                raise ValueError(f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) "
                                 f"needs {prompt_tokens + max_new_tokens - 1} positions, past {name}'s "
                                 f"{limit}: shorten one of them{other}")
        from .engine import MAX_K

        window = self.tree_window  # first: ValueError for caches that cannot roll back, whatever the run
        if room > MAX_K and window and prompt_tokens + max_new_tokens + room >= window:
            raise ValueError(f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) "
                             f"+ {room} tree nodes must stay below the {window}-token sliding "
                             "window, past which this model's token-tree masks are not exact: draft a "
                             "chain (proposer 'draft', 'hybrid', 'adaptive' or 'ngram'), or shorten one "
                             "of them")


def token_ids(prompt) -> list[int]:
    """A prompt given as ids: a flat sequence of integers (numpy's, a 1-D tensor, or a batch of
    one [1, n]), else ValueError (int() read bytes as ids and 1.9 as 1)."""
    if isinstance(prompt, (bytes, bytearray)):
        raise ValueError("a prompt is a str, or a flat sequence of integer token ids; got bytes: decode them")
    if isinstance(prompt, (set, frozenset, dict)):  # read in iteration order, not the caller's
        raise ValueError("a prompt is a str, or a flat sequence of integer token ids; got a "
                         f"{type(prompt).__name__}, which has no order: pass a list")
    try:
        items = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)  # a tensor, an array
    except TypeError:  # not a sequence at all (an int, None)
        items = None
    if not isinstance(items, list):  # a 0-d array's tolist() is its one number
        raise ValueError(f"a prompt is a str, or a flat sequence of integer token ids; got {prompt!r}")
    if len(items) == 1 and isinstance(items[0], list):  # a batch of one
        items = items[0]
    if not items:
        raise ValueError("the prompt is empty: pass at least one token id")
    if (bad := next((i for i in items if not whole(i)), None)) is not None:
        raise ValueError(f"a prompt is a str, or a flat sequence of integer token ids; got {bad!r} in it")
    return [int(i) for i in items]


def _source(name: str) -> tuple[str, dict]:
    """Where from_pretrained should look: (folder or hub id, extra kwargs)."""
    try:
        return _where(name)
    except (OSError, RuntimeError) as e:  # a name past the file system's limit; a ~user with no home
        why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).rstrip(".")
        why = why[:1].lower() + why[1:]
        raise ValueError(f"{clip(name, 80)} is not a model folder, .gguf file or hub id ({why}): check "
                         "the path") from None


def _where(name: str) -> tuple[str, dict]:
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ValueError(f"GGUF file {name} does not exist: check the path")
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        if not (path / "config.json").is_file():  # transformers said "Couldn't instantiate the
            # backend tokenizer from one of: ." of an empty folder
            raise ValueError(f"{name} is a folder with no config.json, not a model folder: check the path "
                             "(a model folder holds config.json, the weights and the tokenizer files)")
        return str(path), {}
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(f"{name} is not a model folder or .gguf file: check the path")
    return name, {}


def check_source(name: str) -> None:
    """ValueError naming the fix where `name` cannot load here for a reason seen without loading:
    a path that is no model folder or .gguf file, or a hub id that is not cached while the hub is
    unreachable. The app checks a custom pair so before it frees the loaded one (a typo cost
    every visitor a reload of the pair it had)."""
    from . import presets

    if needs_fetch(name) and not presets.hub_reachable():
        raise ValueError(f"cannot load model {name!r}: it is not cached and the model hub "
                         f"({presets.hub_endpoint()}) is unreachable: download it on a connected "
                         "machine or pass a local folder")


def files_to_fetch(files: list[str]) -> list[str]:
    """Of a hub repository's files, those from_pretrained reads here: the top folder's config,
    tokenizer and other small files (JSON, text, SentencePiece and tiktoken vocabularies, chat
    templates), and the weights as transformers picks them: model.safetensors, else its index and
    shards, else the same of pytorch_model.bin. Not another framework's weights, variants
    (model.fp16.safetensors), ONNX or GGUF copies, nor any code."""
    top = [f for f in files if "/" not in f]
    small = [f for f in top if f.endswith((".json", ".txt", ".model", ".tiktoken", ".jinja"))]

    def weights(stem: str, ext: str) -> list[str]:
        if f"{stem}.{ext}" in top:
            return [f"{stem}.{ext}"]
        if f"{stem}.{ext}.index.json" in top:
            return [f for f in top if re.fullmatch(rf"{stem}-\d+-of-\d+\.{ext}", f)]
        return []

    return sorted(set(small) | set(weights("model", "safetensors") or weights("pytorch_model", "bin")))


def download_bytes(name: str) -> int | None:
    """Bytes a load of hub model `name` would download (the files_to_fetch of its repository, as
    the hub lists their sizes); None where it downloads nothing (a local folder or .gguf file, a
    cached model) or the hub cannot say (unreachable: the load then fails as it would)."""
    from huggingface_hub import HfApi

    from . import presets

    if not needs_fetch(name) or not presets.hub_reachable():
        return None
    where, _ = _source(name)
    bound_hub_requests()
    try:
        siblings = HfApi().model_info(where, files_metadata=True).siblings or []
    except Exception:  # noqa: BLE001 - gated, missing, offline: the load says which, with its fix
        return None
    sizes = {f.rfilename: f.size or 0 for f in siblings}
    return sum(sizes[f] for f in files_to_fetch(list(sizes)))


def check_download(name: str, most: float | None) -> None:
    """ValueError naming the fix where a load of `name` would download more than `most` bytes
    (None: no bound). A custom pick on a public deployment filled the server's disk with one
    large repository, bounded only by the download's 30 minutes."""
    if most is None or (size := download_bytes(name)) is None or size <= most:
        return
    raise ValueError(f"model {name!r} would download {size / 1e9:.1f} GB, past the {most / 1e9:g} GB "
                     "this server downloads for a model typed in (operators: SPECVIZ_MAX_DOWNLOAD_GB): "
                     "pick a smaller model")


def needs_fetch(name: str) -> bool:
    """`name` is a hub id whose files are not all in the hub cache (presets.is_cached); False for
    a local folder or .gguf file. ValueError for a name that is none of these."""
    from huggingface_hub.errors import HFValidationError

    from . import presets

    where, _ = _source(name)
    if Path(where).is_dir():
        return False
    try:
        return not presets.is_cached(where)
    except HFValidationError:
        raise ValueError(f"{name!r} is not a model folder, .gguf file or hub id (org/name): check "
                         "the name") from None


def fetch(name: str) -> None:
    """Download the files a load of hub model `name` reads (files_to_fetch) into the hub cache,
    unless they are there; nothing for a local folder or .gguf file, nor where the hub is
    unreachable (the load then says what it can: a model cached under other file names loads).
    ValueError naming the fix. On ZeroGPU the app fetches a pair before its job asks for GPU time
    (fetch_apart), so a first use does not spend a visitor's GPU seconds on a download."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from . import presets

    if not needs_fetch(name) or not presets.hub_reachable():
        return
    where, _ = _source(name)
    bound_hub_requests()
    fix = "run again to resume the download, or pick another pair"
    try:
        wanted = files_to_fetch(HfApi().list_repo_files(where))
        if not wanted:
            raise ValueError("its repository has no config, tokenizer or weight files at its top")
        snapshot_download(where, allow_patterns=[glob.escape(f) for f in wanted])
    except GatedRepoError as e:
        raise ValueError(f"cannot download model {name!r}: it is gated on the hub: operators, log in "
                         "(hf auth login) or set HF_TOKEN with access to it") from e
    except RepositoryNotFoundError as e:
        raise ValueError(f"cannot download model {name!r}: the hub has no such model (or it is "
                         "private): check the name") from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            fix = "the server's disk is full (operators: free space), or pick a smaller pair"
        raise ValueError(f"cannot download model {name!r}: {first_line(e).rstrip('.')}: {fix}") from e
    except Exception as e:  # noqa: BLE001 - any other failure said to the visitor
        raise ValueError(f"cannot download model {name!r}: {first_line(e).rstrip('.')}: {fix}") from e


FETCH_SECONDS = 1800  # a download's longest (one at a time: the next visitor's waits on it)
FETCH_MAIN = ("import sys; from specviz.loading import fetch\n"
              "try: fetch(sys.argv[1])\n"
              "except ValueError as e: print(e); sys.exit(1)")


def fetch_apart(name: str) -> None:
    """fetch(name) in a process of its own: spaces forks ZeroGPU's workers from the app's process
    while its threads run, and a download holds huggingface_hub's client and tqdm's locks for
    minutes (a worker forked while one was held would wait on it for ever). ValueError as fetch's."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    try:
        child = subprocess.run([sys.executable, "-c", FETCH_MAIN, name], env=env, capture_output=True,
                               text=True, errors="replace", stdin=subprocess.DEVNULL, timeout=FETCH_SECONDS)
    except subprocess.TimeoutExpired:
        raise ValueError(f"cannot download model {name!r}: the download took over {FETCH_SECONDS // 60} "
                         "minutes: run again to resume it, or pick a smaller pair") from None
    said = child.stdout.strip().splitlines()
    if child.returncode == 1 and said:
        raise ValueError(said[-1])
    if child.returncode != 0:
        why = next(reversed([line for line in child.stderr.splitlines() if line.strip()]), "no message")
        raise ValueError(f"cannot download model {name!r}: the download ended with code "
                         f"{child.returncode} ({why.strip()[:200]}): run again to resume it, or pick "
                         "another pair")


HUB_TIMEOUT_S = 10.0  # a hub request that gets no byte for this long fails (huggingface_hub's usual)


@lru_cache(maxsize=1)
def bound_hub_requests() -> None:
    """Bound the requests of huggingface_hub's shared client that would wait for ever. The client
    has no timeout, and model_info (transformers' revision lookup) even asks for timeout=None: a
    hub that answered the probe and then went quiet held a load, the model lock and a visitor's
    slot for ever. Such a request now waits HUB_TIMEOUT_S for each byte; if it times out, the hub
    is marked unreachable (presets.mark_unreachable) and the request fails as offline mode would:
    huggingface_hub does not retry that, every request for a minute after it fails at once (the
    cache still serves), and the load fails in about HUB_TIMEOUT_S seconds. Requests with a wait
    of their own (downloads, 10 s) keep huggingface_hub's retries; any answer marks the hub
    reachable, so a long download never waits on a probe.

    Downloads from Xet storage (hf_xet, huggingface_hub's default where it is installed) run in
    hf_xet's own client, outside these bounds: they go over plain HTTP through this client
    instead, unless the operator set HF_HUB_DISABLE_XET (any value) to choose."""
    import weakref

    import httpx2
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled
    from huggingface_hub.utils._http import default_client_factory

    from . import presets

    unbounded = weakref.WeakSet()  # requests sent asking to wait for ever, now HUB_TIMEOUT_S

    def bounded() -> httpx2.Client:
        client = default_client_factory()
        client.timeout = httpx2.Timeout(HUB_TIMEOUT_S)
        build, send = client.build_request, client.send

        def build_request(*args, timeout=httpx2.USE_CLIENT_DEFAULT, **kwargs):
            request = build(*args, timeout=HUB_TIMEOUT_S if timeout is None else timeout, **kwargs)
            if timeout is None or timeout is httpx2.USE_CLIENT_DEFAULT:
                unbounded.add(request)
            return request

        def bounded_send(request, *args, **kwargs):
            if presets.hub_quiet():
                raise OfflineModeIsEnabled(f"Cannot reach {request.url}: the model hub went quiet")
            try:
                response = send(request, *args, **kwargs)
            except httpx2.TimeoutException as e:
                if request not in unbounded:
                    raise  # a request with a wait of its own (a download's 10 s): hub retries it
                presets.mark_unreachable()
                raise OfflineModeIsEnabled(f"{request.url} did not answer within "
                                           f"{HUB_TIMEOUT_S:g} s") from e
            presets.mark_reachable()
            return response

        client.build_request, client.send = build_request, bounded_send
        return client

    huggingface_hub.set_client_factory(bounded)
    if "HF_HUB_DISABLE_XET" not in os.environ:
        constants.HF_HUB_DISABLE_XET = True  # read at each download (is_xet_available)


_LOAD_FIXES = (  # (words in transformers' error, the fix said after its first line)
    ("contains custom code", " specviz never runs a model's own code (trust_remote_code): pick a model "
                             "that transformers supports without it."),
    ("Unrecognized configuration class", " specviz runs causal language models (text generators, "
                                         "AutoModelForCausalLM): pick one of those."),
    ("does not recognize this architecture", " Pick a model this transformers version supports (or, "
                                             "operators: pip install --upgrade transformers)."),
)


def load_model(name: str, device: str, dtype: torch.dtype, device_map: str | None = None):
    """(model, tokenizer) from a hub id, local folder or .gguf path; ValueError if unavailable."""
    from huggingface_hub.errors import HFValidationError
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import presets

    where, kwargs = _source(name)
    local = Path(where).is_dir()
    reachable = local or presets.hub_reachable()
    if reachable and not local:
        bound_hub_requests()
    if not reachable:  # no retries against an unreachable hub: use the cache or fail at once
        kwargs["local_files_only"] = True
    elif not local and zerogpu.active() and not needs_fetch(name):  # fetched before the job (app.fetched):
        kwargs["local_files_only"] = True  # no hub request on a visitor's GPU seconds (a HEAD a file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, trust_remote_code=False,
            device_map=device_map, **kwargs)
    except (OSError, HFValidationError, ValueError, SafetensorError) as e:  # a corrupt file too
        offline = not presets.hub_reachable() \
            or any(word in str(e).lower() for word in ("offline", "connect", "resolve"))
        hint = (f" The model hub ({presets.hub_endpoint()}) is unreachable or offline and the model "
                "is not cached: download it on a connected machine or pass a local folder."
                if offline and not local else "")
        # transformers' own fix is on a later line, cut below (and for custom code, not one to take)
        hint = next((fix for words, fix in _LOAD_FIXES if words in str(e)), hint)
        raise ValueError(f"cannot load model {name!r}: {first_line(e).rstrip('.')}.{hint}") from e
    if not tokenizer.encode("Hello, world"):  # transformers makes an empty one where none is saved
        raise ValueError(f"cannot load model {name!r}: it has no tokenizer (text encodes to no ids): copy "
                         "the model's tokenizer files (tokenizer.json, tokenizer_config.json) beside it")
    if device_map is None:
        model.to(device)
    model.eval()
    return model, tokenizer


def _load(name: str, built, device: str, dtype: torch.dtype, device_map: str | None = None):
    """load_model; where name is an embedded model's finished cache (built: its EmbeddedModel, else
    None), a failure says that the cache does not load and how to rebuild it."""
    try:
        return load_model(name, device, dtype, device_map)
    except ValueError as e:
        if built is None:
            raise
        from . import embedded

        raise embedded.damaged(built, e) from e


def keep_draft_codes() -> Path:
    """Quantize the embedded draft once and keep its int4 codes where a CPU load_pair reads them
    (`python -m specviz prepare`: the Docker image then starts without the clipping search)."""
    from . import embedded

    folder = embedded.prepare(embedded.DRAFT)
    path = quant.codes_file(folder)
    if not path.is_file():
        model, _ = _load(str(folder), embedded.DRAFT, "cpu", torch.bfloat16)
        quant.apply(model, "int4", path)
    return path


def check_compatible(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Draft and target must map the same strings to the same ids."""
    for text in _PROBE:
        a, b = target_tok.encode(text), draft_tok.encode(text)
        if a != b:
            raise ValueError(f"incompatible pair: {draft_name} and {target_name} tokenize {text!r} "
                             f"differently ({b[:8]} vs {a[:8]}); pick a draft from the target's family")
    special = {t: target_tok.convert_tokens_to_ids(t) for t in target_tok.all_special_tokens}
    for token, tid in special.items():
        if draft_tok.convert_tokens_to_ids(token) != tid:
            raise ValueError(f"incompatible pair: special token {token!r} has id {tid} in "
                             f"{target_name} but not in {draft_name}")


def model_name(name, role: str) -> str | None:
    """A load_pair argument as the str the loaders take: a pathlib.Path as its path (it failed
    with an AttributeError deep in the loading); anything else but a str, ValueError."""
    if name is None or isinstance(name, str):
        return name
    if isinstance(name, os.PathLike):
        return os.fsdecode(name)
    raise ValueError(f"{role} must be a hub id, a model folder or a .gguf file (a str or a Path), got "
                     f"{type(name).__name__}: for a model already loaded, build specviz.Pair(model, "
                     "tokenizer, draft) yourself")


def load_pair(target: str | os.PathLike | None = None, draft: str | os.PathLike | None = None, *,
              device: str | None = None, dtype: str | torch.dtype | None = None,
              device_map: str | None = None, draft_quant: str = "auto") -> Pair:
    """Load a target and an optional draft. No arguments: the embedded default pair.

    draft_quant: "int4" / "int8" run the draft with 4- / 8-bit weights (CPU only; a draft pass
    takes about 0.3x / 0.6x the time of bf16's, same rule, so still exact); "auto" is int4 on CPU;
    "none" keeps the draft as loaded.
    The target is never quantized.
    """
    if draft_quant not in quant.MODES:  # checked before the slow loads
        raise ValueError(f"draft_quant must be one of {', '.join(quant.MODES)}, got {draft_quant!r}")
    target, draft = (model_name(name, role) for name, role in ((target, "target"), (draft, "draft")))
    device = check_device(device) if device else default_device()
    torch_dtype = parse_dtype(dtype, device)
    names = {"target": target, "draft": draft}
    built = {}  # the embedded models loaded from their cache, by role
    codes = None  # where the draft's int4 groups are kept between loads: the embedded draft's cache
    if target is None:
        from . import embedded

        target, built["target"] = str(embedded.prepare(embedded.TARGET)), embedded.TARGET
        names["target"] = embedded.TARGET.title
        if draft is None:
            draft, built["draft"] = str(embedded.prepare(embedded.DRAFT)), embedded.DRAFT
            names["draft"] = embedded.DRAFT.title
            codes = quant.codes_file(Path(draft))
    target_model, tokenizer = _load(target, built.get("target"), device, torch_dtype, device_map)
    draft_model = None
    if draft is not None:
        draft_model, draft_tok = _load(draft, built.get("draft"), device, torch_dtype)
        check_compatible(tokenizer, draft_tok, names["target"], names["draft"])
        if device_map is not None:
            draft_model.to(target_model.device)
        if label := quant.apply(draft_model, draft_quant, codes):
            names["draft"] = f"{names['draft']} ({label})"
        dense.route(draft_model)
    dense.route(target_model)  # on CPU: oneDNN's kernel where torch's is slow (see dense)
    chat_default = bool(getattr(tokenizer, "chat_template", None)) and \
        "instruct" in names["target"].lower()
    pair = Pair(target_model, tokenizer, draft_model, target_name=names["target"],
                draft_name=names["draft"], chat_default=chat_default)
    pair.tree_window  # noqa: B018 - refuse caches that cannot roll back now, not at the first round
    return pair
