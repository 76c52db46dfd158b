"""The embedded pair's assembly and cache: fake parts for the failure modes, the real pair (slow)."""

import hashlib
import re
import sys

import pytest

from specviz import embedded


def free_space(monkeypatch, free: int, total: int = 10**11) -> None:
    """shutil.disk_usage says `free` bytes are free of `total`, wherever it is asked."""
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(total, total - free, free))


def fake_model(tmp_path, monkeypatch, parts: list[bytes], sha: str | None = None, name="fake"):
    """An EmbeddedModel whose part i is module f'{name}_part{i}' with data/partNN.bin."""
    for i, data in enumerate(parts, 1):
        pkg = tmp_path / "site" / f"{name}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname("
            f"os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    whole = b"".join(parts)
    return embedded.EmbeddedModel(
        name=name, title=f"{name} model", package=f"{name}-part", module=f"{name}_part",
        version="1.0", parts=len(parts), size=len(whole),
        sha256=sha or hashlib.sha256(whole).hexdigest())


def fake_dequantize(gguf_path, out_dir):
    out_dir.mkdir()
    (out_dir / "weights.bin").write_bytes(gguf_path.read_bytes())


def test_assembles_parts_in_order_and_caches(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc", b"def", b"g"])
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    path = embedded.prepare(model)
    assert (path / "weights.bin").read_bytes() == b"abcdefg"
    assert embedded.is_cached(model) and path.parent.parent == tmp_path / "cache"
    assert [p.name for p in path.parent.iterdir() if p.is_dir()] == [path.name]  # no temp folders

    def no_rebuild(*a):
        raise AssertionError("the second load must come from the cache")

    monkeypatch.setattr(embedded, "assemble", no_rebuild)
    assert embedded.prepare(model) == path


def test_wrong_sha256_is_a_clear_error_and_caches_nothing(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc", b"def"], sha="0" * 64, name="badsha")
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    with pytest.raises(ValueError, match=r"sha256.*Reinstall.*badsha-part\{1\.\.2\}==1\.0"):
        embedded.prepare(model)
    assert not embedded.is_cached(model)
    assert [p for p in (tmp_path / "cache" / "embedded").iterdir() if p.is_dir()] == []


def test_missing_part_names_the_package(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc", b"def"], name="gappy")
    sys.modules.pop("gappy_part2", None)
    (tmp_path / "site" / "gappy_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ValueError, match="pip install --force-reinstall gappy-part2==1.0"):
        embedded.prepare(model)
    missing = embedded.EmbeddedModel(**{**model.__dict__, "parts": 3, "name": "gappy3"})
    with pytest.raises(ValueError, match="part 3 of 3 is missing.*pip install gappy-part3==1.0"):
        missing.part_path(3)


def test_interrupted_cache_write_is_never_used_and_retries_cleanly(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc", b"def"], name="flaky")

    def interrupted(gguf_path, out_dir):
        out_dir.mkdir()
        (out_dir / "weights.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_dequantize_to", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embedded.prepare(model)
    assert not embedded.is_cached(model) and not embedded.cache_dir(model).exists()
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    assert (embedded.prepare(model) / "weights.bin").read_bytes() == b"abcdef"


def test_a_killed_builds_temp_folder_is_removed_by_the_next_build(tmp_path, monkeypatch):
    """A build killed outright (SIGKILL, a container stopped) leaves its temp folder, 1-5 GB: the
    next build, holding the lock, removes it."""
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="killed")
    root = tmp_path / "cache" / "embedded"
    (root / ".killed-x1y2z3" / "model").mkdir(parents=True)
    (root / ".killed-x1y2z3" / "killed.gguf").write_bytes(b"half a gguf")
    (root / ".killedother-a1").mkdir()  # another model's name: not this build's to remove
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    path = embedded.prepare(model)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [".killedother-a1", path.name]


def test_concurrent_first_loads_build_once_and_both_get_the_cache(tmp_path, monkeypatch):
    """Two processes (here threads: flock locks open files) loading at once: one builds, the other
    waits and reads the finished cache; neither removes the other's folder."""
    import threading
    import time

    model = fake_model(tmp_path, monkeypatch, [b"abc", b"def"], name="racing")
    builds = []

    def slow_dequantize(gguf_path, out_dir):
        builds.append(threading.current_thread().name)
        time.sleep(0.3)
        fake_dequantize(gguf_path, out_dir)

    monkeypatch.setattr(embedded, "_dequantize_to", slow_dequantize)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(embedded.prepare(model)), name=f"t{i}")
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(builds) == 1 and len(paths) == 2 and paths[0] == paths[1]
    assert (paths[0] / "weights.bin").read_bytes() == b"abcdef" and embedded.is_cached(model)


def test_no_room_for_the_cache_is_a_clear_error_before_any_work(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="cramped")
    model = embedded.EmbeddedModel(**{**model.__dict__, "cache_size": 4_000_000_000})
    free_space(monkeypatch, 10**9, total=10**10)
    monkeypatch.setattr(embedded, "assemble", lambda *a: pytest.fail("started without room"))
    with pytest.raises(ValueError, match=r"only 1\.0 GB is free.*about 4\.0 GB.*SPECVIZ_CACHE"):
        embedded.prepare(model)
    assert not embedded.is_cached(model)


def test_a_disk_that_fills_during_the_build_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="full")

    def full(gguf_path, out_dir):
        out_dir.mkdir()
        (out_dir / "weights.bin").write_bytes(b"ha")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(embedded, "_dequantize_to", full)
    with pytest.raises(ValueError, match="No space left on device.*free some space.*SPECVIZ_CACHE"):
        embedded.prepare(model)
    root = tmp_path / "cache" / "embedded"
    assert [p for p in root.iterdir() if p.is_dir()] == [] and not embedded.is_cached(model)


def test_a_disk_that_fills_while_the_weights_are_written_is_a_clear_error(tmp_path, monkeypatch):
    """save_pretrained writes the weights with safetensors, whose full disk is no OSError but a
    SafetensorError (message as seen on a 600 KB tmpfs): it named no fix and no folder."""
    from safetensors import SafetensorError

    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="fullweights")

    def full(gguf_path, out_dir):
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(b"ha")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(embedded, "_dequantize_to", full)
    with pytest.raises(ValueError, match="No space left on device.*free some space.*SPECVIZ_CACHE"):
        embedded.prepare(model)
    root = tmp_path / "cache" / "embedded"
    assert [p for p in root.iterdir() if p.is_dir()] == [] and not embedded.is_cached(model)

    def foreign(gguf_path, out_dir):  # no errno in it: still the build's error, naming the folder
        raise SafetensorError("Error while serializing: something else")

    monkeypatch.setattr(embedded, "_dequantize_to", foreign)
    with pytest.raises(ValueError, match="something else. Check that folder .or set SPECVIZ_CACHE"):
        embedded.prepare(model)


def test_an_unwritable_cache_folder_is_a_clear_error(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="readonly")
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="cannot build the readonly model cache.*SPECVIZ_CACHE"):
        embedded.prepare(model)


@pytest.mark.slow
def test_embedded_pair_is_exact_and_cached(monkeypatch):
    """The real Qwen2.5-Coder pair: greedy identity with the target alone, then a cached reload."""
    import torch

    import specviz

    pair = specviz.load_pair(device="cpu", dtype="float32")  # fp32: no bf16 logit ties
    assert embedded.is_cached(embedded.TARGET) and embedded.is_cached(embedded.DRAFT)
    from specviz import quant  # the draft's int4 codes are kept for the next load

    assert quant.codes_file(embedded.cache_dir(embedded.DRAFT)).is_file()
    prompt = "Write a Python function that returns the n-th Fibonacci number."
    ids = pair.encode(prompt, chat=True)
    spec = [t for e in specviz.generate(pair, ids, k=4, max_new_tokens=32) for t in e.new_tokens]
    out = pair.target.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    assert spec == out[0, len(ids):].tolist()
    assert "def" in pair.tokenizer.decode(spec)
    from specviz.detok import token_label  # the lab's labels of tokens that hold part of a character

    assert [token_label(pair.tokenizer, i) for i in pair.tokenizer.encode(" 🚀 ñ")] == [
        "' \\xf0\\x9f'", "'\\x9a'", "'\\x80'", "' \\xc3'", "'\\xb1'"]

    assert pair.target_name == embedded.TARGET.title and pair.draft is not None
    # a later load reads the cache: nothing is reassembled (a full second load costs ~45 s here)
    monkeypatch.setattr(embedded, "assemble", lambda *a: pytest.fail("reassembled a cached model"))
    for model in (embedded.TARGET, embedded.DRAFT):
        assert embedded.prepare(model) == embedded.cache_dir(model)


@pytest.mark.parametrize("code, says", [
    ("ENOSPC", "about 0.0 GB free there: free some space"),
    ("EACCES", "Set SPECVIZ_CACHE to a folder you can write to"),
    ("EIO", "Check that folder (or set SPECVIZ_CACHE to another)"),
    ("EDQUOT", "about 0.0 GB free there: free some space"),  # a quota is a full disk to the user
    ("EPERM", "Set SPECVIZ_CACHE to a folder you can write to"),
    ("EROFS", "Set SPECVIZ_CACHE to a folder you can write to"),
])
def test_a_failed_build_names_the_fix_its_error_calls_for(tmp_path, monkeypatch, code, says):
    import errno
    import os

    model = fake_model(tmp_path, monkeypatch, [b"abc"], name=f"err{code.lower()}")

    def failing(gguf_path, out_dir):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(embedded, "_dequantize_to", failing)
    with pytest.raises(ValueError, match=re.escape(says)) as info:
        embedded.prepare(model)
    assert os.strerror(getattr(errno, code)) in str(info.value)
    if code not in ("ENOSPC", "EDQUOT"):
        assert "free some space" not in str(info.value)  # a disk with room is not called full


def test_a_build_parses_each_gguf_once_and_puts_the_reader_back(tmp_path, monkeypatch):
    """transformers opens a fresh GGUFReader for the tokenizer, the config and the weights; inside
    _one_gguf_parse they share one parse of the file (a third of a first load)."""
    import os

    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original, parses = gguf.GGUFReader, []
    build = original._build_fields
    monkeypatch.setattr(original, "_build_fields", lambda self, *a: parses.append(1) or build(self, *a))
    with embedded._one_gguf_parse():
        for _ in range(3):
            assert load_gguf_checkpoint(str(path))["config"]["num_hidden_layers"] == 1
        assert gguf.GGUFReader(os.path.relpath(path)) is gguf.GGUFReader(str(path))  # one file, one parse
        assert len(parses) == 1
    assert gguf.GGUFReader is original
    load_gguf_checkpoint(str(path))
    assert len(parses) == 2  # outside it, every call parses again


def test_the_cache_build_does_not_pass_on_advice_a_user_cannot_take(tmp_path, monkeypatch, model_dirs):
    """transformers warns "Pass `dtype=torch.float32` to avoid it" when a GGUF model is loaded
    packed in bfloat16: the app's first start printed it twice, about a call no user makes."""
    import logging

    import transformers

    advice = logging.getLogger("transformers.quantizers.quantizer_gguf")
    target = str(model_dirs["target"])
    real = transformers.AutoModelForCausalLM.from_pretrained

    def from_pretrained(folder, gguf_file=None, **kwargs):  # the GGUF load: it warns, as 5.24 does
        advice.warning("Loading a GGUF checkpoint with its weights packed is fastest in float32 ...")
        return real(target, **kwargs)

    def tokenizer(folder, gguf_file=None):
        return transformers.PreTrainedTokenizerFast.from_pretrained(target)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    shown = []
    handler = logging.Handler()
    handler.emit = shown.append
    advice.addHandler(handler)
    level = advice.level
    try:
        embedded._dequantize_to(tmp_path / "x.gguf", tmp_path / "out")
        advice.warning("after the build")  # its level is back: later warnings still show
    finally:
        advice.removeHandler(handler)
    assert [r.getMessage() for r in shown] == ["after the build"] and advice.level == level
    assert (tmp_path / "out" / "config.json").exists()


def test_the_cache_folder_is_specviz_cache_else_xdg_cache_home_else_home(tmp_path, monkeypatch):
    """$SPECVIZ_CACHE (~ expanded), else $XDG_CACHE_HOME/specviz, else ~/.cache/specviz; an empty
    variable counts as unset. Each model's folder names its sha256: another build is another folder."""
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="where")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECVIZ_CACHE", "~/mine")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert embedded.cache_root() == tmp_path / "home" / "mine"
    monkeypatch.setenv("SPECVIZ_CACHE", "")
    assert embedded.cache_root() == tmp_path / "xdg" / "specviz"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert embedded.cache_root() == tmp_path / "home" / ".cache" / "specviz"
    assert embedded.cache_dir(model) == tmp_path / "home" / ".cache" / "specviz" / "embedded" / (
        f"where-{model.sha256[:12]}")
    rebuilt = embedded.EmbeddedModel(**{**model.__dict__, "sha256": "f" * 64})
    assert embedded.cache_dir(rebuilt) != embedded.cache_dir(model)


def test_a_part_without_its_path_function_or_file_names_the_package(tmp_path, monkeypatch):
    """A part package that imports but lacks get_part_path, or whose path is not a file (a folder
    left where the file was), names the package to reinstall, like a missing one."""
    model = fake_model(tmp_path, monkeypatch, [b"abc", b"def"], name="odd")
    (tmp_path / "site" / "odd_part1" / "__init__.py").write_text("")
    sys.modules.pop("odd_part1", None)
    with pytest.raises(ValueError, match=r"part 1 of 2 is missing.*get_part_path.*pip install odd-part1=="):
        model.part_path(1)
    part = tmp_path / "site" / "odd_part2" / "data" / "part02.bin"
    part.unlink()
    part.mkdir()
    with pytest.raises(ValueError, match="pip install --force-reinstall odd-part2==1.0"):
        model.part_path(2)


def test_parts_longer_than_a_read_are_assembled_whole(tmp_path, monkeypatch):
    """Parts are read in chunks (8 MiB; 2 bytes here): every chunk of every part is kept."""
    model = fake_model(tmp_path, monkeypatch, [b"abcde", b"fghij"], name="chunked")
    monkeypatch.setattr(embedded, "_CHUNK", 2)
    out = embedded.assemble(model, tmp_path / "whole.gguf")
    assert out.read_bytes() == b"abcdefghij"


def test_a_stale_folder_without_the_complete_marker_is_rebuilt(tmp_path, monkeypatch):
    """A cache folder without its `complete` marker (an older layout's, half written) is not
    a cache: the build replaces it."""
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="stale")
    (embedded.cache_dir(model)).mkdir(parents=True)
    (embedded.cache_dir(model) / "weights.bin").write_bytes(b"old")
    (embedded.cache_dir(model) / "leftover.bin").write_bytes(b"older")
    assert not embedded.is_cached(model)
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    path = embedded.prepare(model)
    assert sorted(p.name for p in path.iterdir()) == ["complete", "weights.bin"]
    assert (path / "weights.bin").read_bytes() == b"abc" and embedded.is_cached(model)


def test_a_build_killed_before_its_cleanup_is_cleaned_by_the_next(tmp_path, monkeypatch):
    """A build whose own cleanup never ran (killed outright) leaves its temp folder beside the
    cache, where the next build finds and removes it."""
    import shutil

    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="cut")
    root = tmp_path / "cache" / "embedded"

    def killed(gguf_path, out_dir):
        raise KeyboardInterrupt

    rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)  # no cleanup: as if killed
    monkeypatch.setattr(embedded, "_dequantize_to", killed)
    with pytest.raises(KeyboardInterrupt):
        embedded.prepare(model)
    left = [p for p in root.iterdir() if p.is_dir()]
    assert len(left) == 1 and (left[0] / "cut.gguf").read_bytes() == b"abc"
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    path = embedded.prepare(model)
    assert [p for p in root.iterdir() if p.is_dir()] == [path]


def test_a_built_cache_is_read_without_taking_the_build_lock(tmp_path, monkeypatch):
    """A finished cache in a folder the user cannot write (a shared, read-only cache) still loads:
    the lock file is only opened to build."""
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="shared")
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    path = embedded.prepare(model)
    monkeypatch.setattr(embedded, "_build_lock", lambda *a: pytest.fail("took the lock to read"))
    assert embedded.prepare(model) == path


def test_a_lock_file_that_cannot_be_opened_is_a_clear_error(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="locked")
    (tmp_path / "cache" / "embedded" / ".locked.lock").mkdir(parents=True)  # not a file
    with pytest.raises(ValueError, match=r"cannot build the locked model cache in .*embedded: .*"
                                         r"Check that folder \(or set SPECVIZ_CACHE to another\)"):
        embedded.prepare(model)


def test_the_room_a_build_needs_is_the_gguf_beside_its_safetensors_copy(tmp_path, monkeypatch):
    """The peak of a build is the assembled GGUF and the safetensors copy together: 3 + 4 GB
    needs 7 GB, and exactly what it needs is enough."""
    assert embedded.DRAFT.room_needed == 491_400_064 + 1_271_818_000
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="roomy")
    free_space(monkeypatch, 10**9)
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    exact = embedded.EmbeddedModel(**{**model.__dict__, "cache_size": 10**9 - 3})  # 3 + cache_size
    assert embedded.prepare(exact) and embedded.is_cached(exact)
    big = embedded.EmbeddedModel(**{**model.__dict__, "name": "big", "size": 3 * 10**9,
                                    "cache_size": 4 * 10**9})
    free_space(monkeypatch, 5 * 10**9)
    with pytest.raises(ValueError, match=r"only 5\.0 GB is free.*about 7\.0 GB free there"):
        embedded.prepare(big)


def test_prepare_all_returns_the_target_then_the_draft(tmp_path, monkeypatch):
    """`python -m specviz prepare` builds both and reads the pair's folders as (target, draft)."""
    target = fake_model(tmp_path, monkeypatch, [b"big"], name="tgt")
    draft = fake_model(tmp_path / "d", monkeypatch, [b"small"], name="drf")
    monkeypatch.setattr(embedded, "TARGET", target)
    monkeypatch.setattr(embedded, "DRAFT", draft)
    monkeypatch.setattr(embedded, "_dequantize_to", fake_dequantize)
    t, d = embedded.prepare_all()
    assert (t / "weights.bin").read_bytes() == b"big" and (d / "weights.bin").read_bytes() == b"small"


def test_an_os_error_without_a_message_is_named_by_its_type(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="mute")

    def failing(gguf_path, out_dir):
        raise OSError()

    monkeypatch.setattr(embedded, "_dequantize_to", failing)
    with pytest.raises(ValueError, match=r"cache in .*embedded: OSError\. Check that folder"):
        embedded.prepare(model)


def test_the_cache_copy_is_a_plain_model_that_stops_at_either_chat_end(tmp_path, monkeypatch, model_dirs):
    """The safetensors copy is no longer marked quantized (a loader would look for the GGUF), holds
    the tokenizer, and its generation config stops at <|im_end|> (a chat turn's end) and at
    <|endoftext|>, where the GGUF's config names one of them."""
    import json

    import transformers

    target = str(model_dirs["target"])
    real = transformers.AutoModelForCausalLM.from_pretrained
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(target)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert im_end != eot and im_end >= 0

    def from_pretrained(folder, gguf_file=None, **kwargs):  # loaded from a GGUF: marked quantized
        model = real(target, **kwargs)
        model.config.quantization_config = {"quant_method": "gguf"}
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda folder, gguf_file=None: tok)
    out = tmp_path / "out"
    embedded._dequantize_to(tmp_path / "x.gguf", out)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [im_end, eot]
    monkeypatch.undo()
    assert transformers.AutoTokenizer.from_pretrained(str(out)).convert_tokens_to_ids("<|im_end|>") == im_end


@pytest.mark.parametrize("damage", ["truncated", "removed"])
def test_a_damaged_cache_is_refused_with_the_fix(tmp_path, monkeypatch, model_dirs, damage):
    """A cache folder with its `complete` marker but a weights file cut short or gone (a copy or a
    crash that wrote the marker, not the data) failed every load with safetensors' words alone:
    nothing said the cache was at fault, nor that deleting it makes the next load rebuild it."""
    import shutil

    import specviz

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    for model, source in ((embedded.TARGET, "target"), (embedded.DRAFT, "draft")):
        shutil.copytree(model_dirs[source], embedded.cache_dir(model))
        (embedded.cache_dir(model) / "complete").write_text(f"{model.sha256}\n")
    assert specviz.load_pair(device="cpu", draft_quant="none").draft is not None  # whole: it loads
    for model in (embedded.TARGET, embedded.DRAFT):
        weights = embedded.cache_dir(model) / "model.safetensors"
        saved = weights.read_bytes()
        if damage == "truncated":
            weights.write_bytes(saved[: len(saved) // 2])
        else:
            weights.unlink()
        with pytest.raises(ValueError, match=rf"{re.escape(model.title)} cache in "
                                             rf"{re.escape(str(embedded.cache_dir(model)))} does not load.*"
                                             "delete that folder and load again"):
            specviz.load_pair(device="cpu", draft_quant="none")
        weights.write_bytes(saved)


def test_the_cache_is_as_readable_as_the_umask_lets_a_plain_file_be(tmp_path, monkeypatch):
    """safetensors writes its files owner-only (0600) whatever the umask: a cache built by one user
    (a Docker image's build, an operator's shared SPECVIZ_CACHE) could not be read by another,
    who was told the cache was damaged and to delete a folder it does not own. Every file of the
    cache now has the read bits a plain file beside it has; a umask that keeps others out still
    does."""
    import os
    import shutil

    model = fake_model(tmp_path, monkeypatch, [b"abc"], name="modes")

    def owner_only(gguf_path, out_dir):  # as safetensors writes model.safetensors
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes())
        (out_dir / "model.safetensors").chmod(0o600)

    monkeypatch.setattr(embedded, "_dequantize_to", owner_only)
    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        old = os.umask(umask)
        try:
            path = embedded.prepare(model)
        finally:
            os.umask(old)
        assert (path / "model.safetensors").stat().st_mode & 0o777 == mode, oct(umask)
        shutil.rmtree(path)
