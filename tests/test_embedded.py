"""The embedded pair's assembly and cache: fake parts for the failure modes, the real pair (slow)."""

import hashlib
import sys

import pytest

from specviz import embedded


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
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp folders left

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
    assert list((tmp_path / "cache" / "embedded").iterdir()) == []


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

    assert pair.target_name == embedded.TARGET.title and pair.draft is not None
    # a later load reads the cache: nothing is reassembled (a full second load costs ~45 s here)
    monkeypatch.setattr(embedded, "assemble", lambda *a: pytest.fail("reassembled a cached model"))
    for model in (embedded.TARGET, embedded.DRAFT):
        assert embedded.prepare(model) == embedded.cache_dir(model)
