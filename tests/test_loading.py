"""load_pair: local folders, vocab padding, compatibility and error messages."""

from types import SimpleNamespace

import pytest
import torch

import specviz
from specviz.cli import main


def test_padded_draft_vocab_is_masked(model_dirs):
    pair = specviz.load_pair(str(model_dirs["target"]), str(model_dirs["padded-draft"]),
                             device="cpu", dtype="float32")
    assert pair.draft.get_output_embeddings().weight.shape[0] == len(pair.tokenizer) + 16
    assert pair.vocab_size == len(pair.tokenizer)
    for temperature in (0.0, 1.0):
        events = list(specviz.generate(pair, "for i in", k=4, max_new_tokens=30,
                                       temperature=temperature))
        drafted = [t for e in events for t in e.draft_tokens]
        assert drafted and max(drafted) < pair.vocab_size


def test_incompatible_pair_names_both_models(model_dirs):
    with pytest.raises(ValueError, match="incompatible pair.*other-tokenizer.*target|"
                                         "incompatible pair.*target.*other-tokenizer"):
        specviz.load_pair(str(model_dirs["target"]), str(model_dirs["other-tokenizer"]),
                          device="cpu", dtype="float32")


@pytest.mark.parametrize("name", ["/no/such/model", "./missing-folder", "missing.gguf", "a/b/c"])
def test_unknown_path_is_a_clear_error(name):
    with pytest.raises(ValueError, match="check the path"):
        specviz.load_pair(name, device="cpu")


def test_offline_hub_id_fails_fast_and_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="offline|cannot load"):
        specviz.load_pair("nobody/definitely-not-cached-model", device="cpu")


def test_a_torch_dtype_that_is_no_float_is_refused_before_the_load():
    """torch.int8 reached transformers, which refused it in its own words once the load began."""
    from specviz.loading import parse_dtype

    assert parse_dtype(torch.float64, "cpu") is torch.float64
    for dtype in (torch.int8, torch.bool, torch.uint8):
        with pytest.raises(ValueError, match="no floating-point type: use float32, bfloat16 or float16"):
            specviz.load_pair("no/such-model", dtype=dtype, device="cpu")


def test_a_path_loads_as_its_str_and_a_model_object_is_a_clear_error(model_dirs, pair):
    """A pathlib.Path failed with "'PosixPath' object has no attribute 'endswith'"; a loaded model
    with pathlib's TypeError."""
    loaded = specviz.load_pair(model_dirs["target"], model_dirs["draft"], device="cpu", dtype="float32")
    assert loaded.target_name == str(model_dirs["target"]) and loaded.draft is not None
    folder = str(model_dirs["target"])
    for target, draft, role in ((pair.target, None, "target"), (folder, pair.draft, "draft")):
        with pytest.raises(ValueError, match=f"{role} must be a hub id, a model folder or a .gguf file"):
            specviz.load_pair(target, draft, device="cpu")


def test_bad_dtype_is_a_clear_error(model_dirs):
    with pytest.raises(ValueError, match="unknown dtype"):
        specviz.load_pair(str(model_dirs["target"]), device="cpu", dtype="float8")


def test_chat_template_is_applied(pair):
    plain = pair.encode("hello")
    chat = pair.encode("hello", chat=True)
    assert chat != plain and pair.tokenizer.decode(chat).startswith("<user>hello")


def test_a_chat_template_that_refuses_the_prompt_names_the_fix(pair, monkeypatch):
    """A template's raise_exception (Gemma's "roles must alternate", a system-only template) raised
    jinja's TemplateError, no ValueError: the page said a bare "Error" and the CLI a traceback."""
    monkeypatch.setattr(pair.tokenizer, "chat_template",
                        "{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    with pytest.raises(ValueError, match=r"chat template refused the prompt \(Conversation roles must "
                                         r"alternate user/assistant\): turn chat off"):
        pair.encode("hello", chat=True)
    assert pair.encode("hello") == pair.encode("hello", chat=False)  # chat off still reads it
    # a message of several lines: its first, as the page's one-line error shows
    monkeypatch.setattr(pair.tokenizer, "chat_template",
                        "{{ raise_exception('No system turns.\\nPut them in the first user turn.') }}")
    with pytest.raises(ValueError, match=r"refused the prompt \(No system turns\.\): turn chat off"):
        pair.encode("hello", chat=True)
    # a template that does not parse refused nothing: it said "refused the prompt (unexpected '}')"
    monkeypatch.setattr(pair.tokenizer, "chat_template", "{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ValueError, match=r"chat template does not parse \(unexpected '}'\): turn chat off"):
        pair.encode("hello", chat=True)


def test_special_tokens_typed_in_a_chat_message_are_text_and_without_chat_tokens(pair):
    """A message's "<|endoftext|>" is the message's text, not the end of the turn; chat off, a
    prompt is read as the model reads it (control tokens included, as FIM prompts need)."""
    eos = pair.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    typed = "hi <|endoftext|>"
    chat = pair.encode(typed, chat=True)
    assert eos not in chat and pair.tokenizer.decode(chat) == "<user>hi <|endoftext|>\n<assistant>"
    assert pair.encode("hi", chat=True) == pair.tokenizer.encode("<user>hi\n<assistant>")  # as before
    assert pair.encode(typed) == pair.tokenizer.encode("hi ") + [eos]


def test_cli_run_json(model_dirs, capsys):
    import json

    rc = main(["run", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--k", "3", "--max-new-tokens", "12",
               "--json", "--compare-baseline", "def f"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rounds, summary = lines[:-1], lines[-1]
    assert all(r["type"] == "round" for r in rounds) and summary["type"] == "summary"
    assert summary["new_tokens"] == 12 == sum(len(r["new_tokens"]) for r in rounds)
    assert summary["identical_to_baseline"] is True and summary["first_difference"] is None


def test_cli_run_plain_text_when_not_a_tty(model_dirs, capsys):
    rc = main(["run", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "8", "def f"])
    out = capsys.readouterr().out
    assert rc == 0 and "\x1b[" not in out and "target passes" in out


def test_default_device_and_dtype():
    from specviz.loading import check_device, default_dtype, parse_dtype

    assert parse_dtype(None, "cpu") == default_dtype("cpu") == torch.bfloat16
    assert parse_dtype("float32", "cpu") == torch.float32
    for short, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        assert parse_dtype(short, "cpu") == dtype
    for device in ("meta", "xpu"):  # devices torch knows that specviz does not run on
        with pytest.raises(ValueError, match="runs on cpu, cuda or mps"):
            check_device(device)


def test_a_gpu_this_machine_lacks_is_refused_before_any_load(monkeypatch):
    """check_device promises a device this torch can use: cuda:1 on a one-GPU machine passed,
    and the load then failed in model.to with torch's 'invalid device ordinal', no fix named."""
    from specviz.loading import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda") == "cuda" and check_device("cuda:0") == "cuda:0"
    with pytest.raises(ValueError, match=r"device 'cuda:1': this machine has 1 CUDA GPU.*use cuda:0"):
        check_device("cuda:1")


def test_loading_asks_only_the_local_cache_when_the_hub_is_unreachable_and_never_runs_remote_code(
        monkeypatch):
    """Where the probe finds no hub, transformers is told local_files_only (no request, so no
    retries); and neither the tokenizer nor the model may run code from a repository."""
    import transformers

    from specviz import loading, presets

    monkeypatch.setattr(presets, "hub_reachable", lambda timeout=1.5: False)
    seen = []

    def fake(kind):
        def from_pretrained(where, **kwargs):
            seen.append((kind, kwargs.get("local_files_only"), kwargs.get("trust_remote_code")))
            if kind == "model":
                raise OSError("not cached")
            return SimpleNamespace(encode=lambda text: [1], chat_template=None)
        return from_pretrained

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake("tokenizer"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake("model"))
    with pytest.raises(ValueError):
        loading.load_model("nobody/x", "cpu", torch.float32)
    assert seen == [("tokenizer", True, False), ("model", True, False)]


def test_a_broken_local_folder_is_not_blamed_on_the_hub(monkeypatch, tmp_path):
    from specviz import loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as error:
        loading.load_model(str(tmp_path), "cpu", torch.float32)
    assert "unreachable" not in str(error.value)


def test_unreachable_hub_fails_without_touching_the_network(monkeypatch):
    import httpx2 as httpx

    from specviz import presets

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(presets, "hub_reachable", lambda timeout=1.5: False)

    sent = []

    def no_network(self, request, *args, **kwargs):
        sent.append(str(request.url))
        raise httpx.ConnectError("no network in this test", request=request)

    monkeypatch.setattr(httpx.Client, "send", no_network)
    with pytest.raises(ValueError, match="unreachable"):
        specviz.load_pair("nobody/not-cached-anywhere", device="cpu")
    assert sent == []  # local_files_only: no request, so no retries


def test_a_preset_counts_as_cached_only_with_its_weights(monkeypatch):
    """An interrupted download can leave config.json alone in the hub cache: offline, such a preset
    is listed unavailable, so choosing it never frees the loaded pair for a load that fails."""
    import huggingface_hub

    from specviz import presets

    files = {"config.json"}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name, **_: f"/cache/{repo}/{name}" if name in files else None)
    monkeypatch.setattr(presets, "hub_reachable", lambda timeout=1.5: False)
    assert not presets.is_cached("gpt2")
    assert "not cached" in presets.availability(presets.BY_KEY["gpt2"], allow_large=False)
    files |= {"model.safetensors"}
    assert not presets.is_cached("gpt2")  # no tokenizer yet
    files |= {"tokenizer.json"}
    assert presets.is_cached("gpt2")
    assert presets.availability(presets.BY_KEY["gpt2"], allow_large=False) is None


def test_a_sharded_model_counts_as_cached_only_with_every_shard(monkeypatch, tmp_path):
    import json

    import huggingface_hub

    from specviz import presets

    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                "b.weight": "model-00002-of-00002.safetensors"}}))
    files = {"config.json": "/c", "tokenizer.json": "/t", index.name: str(index),
             "model-00001-of-00002.safetensors": "/s1"}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name, **_: files.get(name))
    assert not presets.is_cached("big/model")  # one shard of two: an interrupted download
    files["model-00002-of-00002.safetensors"] = "/s2"
    assert presets.is_cached("big/model")
    index.write_text("{not json")
    assert not presets.is_cached("big/model")
    index.write_text(json.dumps({"weight_map": {}}))
    assert not presets.is_cached("big/model")


def test_a_gated_preset_without_a_token_is_listed_unavailable(monkeypatch):
    """meta-llama's models need a token of an account granted access: without one, choosing the
    preset freed the loaded pair for a load that failed, and the next visitor paid a reload."""
    import huggingface_hub

    from specviz import presets

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name, **_: None)
    monkeypatch.setattr(presets, "hub_reachable", lambda timeout=3.0: True)
    llama = presets.BY_KEY["llama-3.1-8b"]
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    why = presets.availability(llama, allow_large=True)
    assert why.startswith("gated on the hub") and "HF_TOKEN" in why and "meta-llama/Llama-3.1-8B" in why
    assert presets.availability(presets.BY_KEY["gpt2"], allow_large=True) is None  # not gated
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token")
    assert presets.availability(llama, allow_large=True) is None


def test_a_prompt_the_target_cannot_read_is_refused_when_encoded(pair):
    """A custom pair whose tokenizer is longer than its target's vocabulary: an id past the
    embedding was fed to the target (an IndexError here; on a GPU a device-side assert that fails
    every later job of the process)."""
    from dataclasses import replace

    short = replace(pair)
    short.__dict__["vocab_size"] = 10  # the target reads ids 0..9 only
    ids = pair.encode("def fibonacci(n):")
    assert max(ids) >= 10 and short.encode([1, 2, 9]) == [1, 2, 9]
    with pytest.raises(ValueError, match=rf"token id {next(i for i in ids if i >= 10)}, past the 10 ids"):
        short.encode("def fibonacci(n):")


def test_a_folder_that_holds_no_model_says_so_and_a_name_no_file_system_takes_is_refused(tmp_path):
    """An empty folder (or /tmp) failed with transformers' "Couldn't instantiate the backend
    tokenizer from one of: ."; a name with a part past 255 bytes with an OSError, and a ~user
    with no home with a RuntimeError (a traceback on the command line, a bare "Error" on the page)."""
    from specviz.loading import check_source

    with pytest.raises(ValueError, match="is a folder with no config.json, not a model folder: check the "
                                         "path"):
        specviz.load_pair(str(tmp_path), device="cpu")
    for name in ("a" * 300, str(tmp_path / ("b" * 300)), "c" * 300 + ".gguf", "~no-such-user-specviz/model"):
        for load in (check_source, lambda n: specviz.load_pair(n, device="cpu")):
            with pytest.raises(ValueError, match=r"is not a model folder, \.gguf file or hub id \(.+\): "
                                                 "check the path") as error:
                load(name)
            assert len(str(error.value)) < 200  # the name clipped


@pytest.mark.parametrize("config, fix", [
    ({"model_type": "qwen2-custom", "auto_map": {"AutoConfig": "configuration.C",
                                                  "AutoModelForCausalLM": "modeling.M"}},
     "specviz never runs a model's own code (trust_remote_code): pick a model"),
    ({"model_type": "t5"}, "specviz runs causal language models (text generators, AutoModelForCausalLM): "
                           "pick"),
    ({"model_type": "frobnicator"}, "Pick a model this transformers version supports (or, operators: pip "
                                    "install --upgrade transformers)"),
])
def test_a_model_transformers_cannot_load_as_a_causal_lm_names_the_fix(config, fix, model_dirs, tmp_path):
    """transformers' own fix is on a later line of its message, which is cut at its first: a model
    with custom code, an encoder-decoder and an unknown architecture said what went wrong and no
    fix (and custom code's cut fix, trust_remote_code=True, is one specviz never takes)."""
    import json
    import shutil

    for part in model_dirs["target"].glob("tokenizer*"):
        shutil.copy(part, tmp_path / part.name)
    base = json.loads((model_dirs["target"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(base | config))
    with pytest.raises(ValueError, match="cannot load model") as error:
        specviz.load_pair(str(tmp_path), device="cpu", dtype="float32")
    assert fix in str(error.value)


def test_prompt_ids_out_of_range_name_the_id_and_the_fix(pair):
    v = pair.vocab_size  # the first id past the vocabulary named, wherever it is; the last id is v - 1
    for ids, bad in (([1, -1], -1), ([10**6], 10**6), ([2, v, 3, v + 1], v)):
        with pytest.raises(ValueError, match=rf"must be in 0\.\.{v - 1}, got {bad}: "
                                             "pass ids of this pair's tokenizer"):
            specviz.generate(pair, ids)
    assert pair.encode([0, v - 1]) == [0, v - 1]
