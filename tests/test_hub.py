"""The model hub: the reachability probe, and loads against a hub that goes quiet (no hanging)."""

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from specviz import presets


class FakeHub:
    """A local server. silent: accepts connections and never answers. root: answers HEAD / with
    `status` (as a working hub or mirror does), then never answers any other request. drip: sends
    a status line, then a header every 0.3 s, never ending the headers."""

    def __init__(self, mode: str, status: int = 200):
        self.mode, self.status, self.requests, self.held = mode, status, [], []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.held.append(conn)
            if self.mode != "silent":
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        method, path = data.split(b"\r\n")[0].decode().split()[:2]
        self.requests.append(f"{method} {path}")
        if self.mode == "drip":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(40):
                time.sleep(0.3)
                try:
                    conn.sendall(b"X-a: b\r\n")
                except OSError:  # closed
                    return
        elif path == "/":
            conn.sendall(f"HTTP/1.1 {self.status} X\r\nContent-Length: 0\r\n\r\n".encode())
            conn.close()

    def close(self):
        self.server.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def hub(request):
    made = []

    def make(mode, status=200):
        made.append(FakeHub(mode, status))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_a_hub_that_accepts_and_never_answers_is_unreachable_within_the_timeout(hub):
    silent = hub("silent")
    start = time.monotonic()
    assert presets._answers(silent.url, timeout=0.5) is False
    assert time.monotonic() - start < 2.0  # the probe's whole exchange is bounded


def test_a_hub_that_sends_a_byte_now_and_then_cannot_hold_the_probe_past_its_timeout(hub):
    """A status line, then a header every 0.3 s: each read meets httpx's timeout, the exchange as
    a whole does not. The probe gives up at its timeout (it took 13 s without its thread's bound)."""
    dripping = hub("drip")
    start = time.monotonic()
    assert presets._answers(dripping.url + "/", 1.0) is False
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize("status, reachable", [(200, True), (404, True), (401, True), (503, False)])
def test_any_answer_below_500_is_a_reachable_hub(hub, status, reachable):
    assert presets._answers(hub("root", status).url, timeout=2.0) is reachable


def test_refused_or_malformed_addresses_are_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
    assert presets._answers(f"http://127.0.0.1:{port}", timeout=1.0) is False
    assert presets._answers("not a url", timeout=1.0) is False


def test_the_probe_asks_the_configured_endpoint_and_keeps_its_answer_a_while(monkeypatch):
    """HF_ENDPOINT's mirror is the hub probed (huggingface_hub reads it into constants.ENDPOINT);
    the answer is kept PROBE_TTL_S seconds, then asked again; offline mode never probes."""
    from huggingface_hub import constants

    asked, answers, now = [], [True, False], [1000.0]
    monkeypatch.setattr(constants, "ENDPOINT", "http://mirror.example:8080")
    monkeypatch.setattr(presets, "_answers", lambda url, timeout: asked.append(url) or answers.pop(0))
    monkeypatch.setattr(presets.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(presets, "_probe", None)
    monkeypatch.setattr(presets, "_quiet_since", None)  # mark_unreachable below sets it
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert presets.hub_reachable() and presets.hub_reachable()
    assert asked == ["http://mirror.example:8080"]
    now[0] += presets.PROBE_TTL_S + 1
    assert not presets.hub_reachable()
    assert len(asked) == 2
    presets.mark_unreachable()  # a request timed out: unreachable from now on, for a while
    assert not presets.hub_reachable()
    presets.mark_reachable()  # a request answered: reachable again, with no probe; offline mode wins
    assert presets.hub_reachable() and len(asked) == 2
    for value in ("1", "true", "ON", "yes"):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert not presets.hub_reachable()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")  # huggingface_hub reads it when HF's is unset
    assert not presets.hub_reachable() and len(asked) == 2
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    now[0] += presets.PROBE_TTL_S + 1
    answers.append(True)
    assert presets.hub_reachable()
    assert len(asked) == 3


LOAD = textwrap.dedent("""
    import time, torch
    from specviz import loading, presets
    loading.HUB_TIMEOUT_S = 1.5
    assert presets.hub_reachable(), "the mirror answers HEAD /"
    start = time.monotonic()
    try:
        loading.load_model("nobody/not-cached-anywhere", "cpu", torch.float32)
    except ValueError as e:
        print("ValueError:", e)
    print("took", round(time.monotonic() - start, 1))
""")


XET = textwrap.dedent("""
    import os
    from huggingface_hub import constants
    from huggingface_hub.utils._runtime import is_xet_available as on
    from specviz import loading
    for setting in (None, "0", "1"):  # unset, or the operator's choice
        os.environ.pop("HF_HUB_DISABLE_XET", None)
        if setting is not None:
            os.environ["HF_HUB_DISABLE_XET"] = setting
        constants.HF_HUB_DISABLE_XET = setting == "1"  # as huggingface_hub reads it at import
        before = on()
        loading.bound_hub_requests.__wrapped__()  # what the first load from the hub does
        print(setting, before, on())
""")


def test_hub_downloads_leave_xet_for_the_bounded_client_unless_the_operator_chose():
    """hf_xet downloads in its own client, which HUB_TIMEOUT_S does not bound: once a load goes to
    the hub, downloads take plain HTTP through the bounded client, unless HF_HUB_DISABLE_XET is set."""
    pytest.importorskip("hf_xet")
    done = subprocess.run([sys.executable, "-c", XET], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["None True False", "0 True True", "1 False False"]


def test_a_load_from_a_hub_that_answers_the_probe_then_goes_quiet_fails_soon(hub, tmp_path):
    """huggingface_hub's client waits for ever on model_info (timeout=None): such a load held the
    model lock for ever. Now it fails, naming the hub, in about HUB_TIMEOUT_S seconds."""
    quiet = hub("root")
    env = {**os.environ, "HF_ENDPOINT": quiet.url, "HF_HUB_OFFLINE": "0",
           "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ValueError: cannot load model 'nobody/not-cached-anywhere'" in done.stdout
    assert f"model hub ({quiet.url}) is unreachable" in done.stdout
    took = float(done.stdout.split("took")[-1])
    assert took < 30, done.stdout  # 1.5 s per quiet request; then every request fails at once
    assert any(r.startswith("GET /api/models/nobody/not-cached-anywhere") for r in quiet.requests)


def test_the_bounded_client_fails_only_requests_that_would_wait_for_ever(hub, monkeypatch):
    """A request asking for no timeout (model_info) that goes unanswered marks the hub quiet and
    fails as offline mode would, and so does every request for a minute after it; a request with
    a wait of its own (a download's 10 s) keeps huggingface_hub's retries; an answer marks the hub
    reachable without a probe (a long download must not depend on one made while it fills the
    link), and a failed probe alone refuses no request."""
    import httpx2
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    from specviz import loading

    monkeypatch.setattr(presets, "_probe", None)
    monkeypatch.setattr(presets, "_quiet_since", None)
    monkeypatch.setattr(loading, "HUB_TIMEOUT_S", 0.5)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the tests' offline mode, off for this one
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    loading.bound_hub_requests()
    client = huggingface_hub.get_session()
    quiet, answering = hub("silent"), hub("root")
    with pytest.raises(httpx2.TimeoutException):
        client.get(quiet.url, timeout=0.3)  # a wait of its own: the caller's to retry
    assert not presets.hub_quiet()
    monkeypatch.setattr(presets, "_probe", (time.monotonic(), False))  # as a failed probe leaves
    assert not presets.hub_reachable() and not presets.hub_quiet()
    assert client.head(answering.url).status_code == 200  # requests still go: not quiet
    assert presets.hub_reachable()  # and the answer counts, with no probe
    start = time.monotonic()
    with pytest.raises(OfflineModeIsEnabled, match="did not answer within 0.5 s"):
        client.get(quiet.url, timeout=None)
    assert presets.hub_quiet() and not presets.hub_reachable()
    with pytest.raises(OfflineModeIsEnabled, match="went quiet"):
        client.head(answering.url)  # every request after it fails at once
    assert time.monotonic() - start < 5


GPT2_FILES = [  # openai-community/gpt2's top folder and subfolders, as the hub lists them
    ".gitattributes", "64-8bits.tflite", "64-fp16.tflite", "64.tflite", "README.md", "config.json",
    "flax_model.msgpack", "generation_config.json", "merges.txt", "model.safetensors",
    "onnx/config.json", "onnx/decoder_model.onnx", "onnx/merges.txt", "pytorch_model.bin",
    "rust_model.ot", "tf_model.h5", "tokenizer.json", "tokenizer_config.json", "vocab.json"]


def test_a_download_takes_what_a_load_reads_and_one_weight_format():
    from specviz.loading import files_to_fetch

    assert files_to_fetch(GPT2_FILES) == ["config.json", "generation_config.json", "merges.txt",
                                          "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                          "vocab.json"]
    sharded = ["config.json", "consolidated.safetensors", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "model.safetensors.index.json", "params.json",
               "model.fp16-00001-of-00001.safetensors", "tokenizer.model", "tokenizer_config.json",
               "modeling_custom.py", "chat_template.jinja", "pytorch_model.bin"]
    assert files_to_fetch(sharded) == [  # not Mistral's consolidated copy, a variant, nor any code
        "chat_template.jinja", "config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "params.json",
        "tokenizer.model", "tokenizer_config.json"]
    older = ["config.json", "pytorch_model.bin", "tf_model.h5", "spiece.model", "tokenizer_config.json"]
    assert files_to_fetch(older) == ["config.json", "pytorch_model.bin", "spiece.model",
                                     "tokenizer_config.json"]


@pytest.fixture
def hub_cache(monkeypatch, tmp_path):
    """An empty hub cache, and a hub whose snapshot_download lays out the files it is allowed in
    it (as huggingface_hub does), from `hub_cache.repos` ({repo id: its files}); hub_cache.calls
    records each download, and hub_cache.failure (an exception) fails the next."""
    import fnmatch
    import types

    import huggingface_hub
    from huggingface_hub import constants

    cache = types.SimpleNamespace(repos={}, calls=[], failure=None)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(presets, "hub_reachable", lambda: True)

    def snapshot_download(repo_id, allow_patterns=None):
        cache.calls.append(repo_id)
        if cache.failure is not None:
            raise cache.failure
        root = tmp_path / f"models--{repo_id.replace('/', '--')}"
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text("a" * 40)
        snapshot = root / "snapshots" / ("a" * 40)
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in cache.repos[repo_id]:
            if any(fnmatch.fnmatch(name, pattern) for pattern in allow_patterns):
                (snapshot / name).write_text("{}")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda self, repo_id: cache.repos[repo_id])
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return cache


def test_what_a_fetch_downloads_is_what_the_cache_check_counts_as_whole(hub_cache, tmp_path):
    """A download of what files_to_fetch picks leaves the model cached (presets.is_cached): a model
    whose tokenizer is a SentencePiece spiece.model was downloaded again at every run, and failed
    while the hub was unreachable though its files were all on disk."""
    from specviz import loading

    hub_cache.repos = {"org/gpt": GPT2_FILES, "org/spm": ["config.json", "model.safetensors", "spiece.model",
                                                          "tokenizer_config.json", "README.md"],
                       "org/odd": ["config.json", "model.safetensors", "tokenizer.json", "added[1].json"]}
    for repo in hub_cache.repos:
        assert loading.needs_fetch(repo)
        loading.fetch(repo)
        loading.fetch(repo)  # cached now: nothing downloads
        assert not loading.needs_fetch(repo) and presets.is_cached(repo)
    assert hub_cache.calls == list(hub_cache.repos)
    assert list(tmp_path.glob("models--org--odd/snapshots/*/added[[]1].json"))  # a name read as itself
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    assert not loading.needs_fetch(str(tmp_path / "folder"))  # a local folder
    loading.fetch(str(tmp_path / "folder"))
    assert len(hub_cache.calls) == 3


def test_a_failed_fetch_names_its_fix(hub_cache, monkeypatch):
    import errno

    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from specviz import loading

    with pytest.raises(ValueError, match="not a model folder, .gguf file or hub id"):
        loading.needs_fetch("not a valid id!")  # huggingface_hub's own check, in the cache lookup
    hub_cache.repos = {"org/m": GPT2_FILES}
    response = type("Response", (), {"headers": {}, "status_code": 404, "url": "u", "request": None})()
    for failure, said in [
            (GatedRepoError("403 Forbidden", response=response),
             "it is gated on the hub: operators, log in .hf auth login. or set HF_TOKEN"),
            (RepositoryNotFoundError("404 Client Error.", response=response),
             "the hub has no such model .or it is private.: check the name"),
            (OSError(errno.ENOSPC, "No space left on device"),
             "No space left on device: the server's disk is full .operators: free space."),
            (ConnectionError("Connection reset by peer"),
             "Connection reset by peer: run again to resume the download, or pick another pair")]:
        hub_cache.failure = failure
        with pytest.raises(ValueError, match=f"^cannot download model 'org/m': .*{said}"):
            loading.fetch("org/m")
    monkeypatch.setattr(presets, "hub_reachable", lambda: False)
    calls = len(hub_cache.calls)
    loading.fetch("org/m")  # nothing to download from: the load says what it can
    assert len(hub_cache.calls) == calls


def test_a_fetch_apart_runs_in_its_own_process_and_brings_its_message_back(monkeypatch):
    """The download runs in a child process (a ZeroGPU worker forked from the app while a download
    thread held a lock would wait on it for ever): its ValueError comes back whole, and a child
    that dies says so."""
    from specviz import loading

    with pytest.raises(ValueError, match=r"^'not a valid id!' is not a model folder, .gguf file or hub id"):
        loading.fetch_apart("not a valid id!")
    monkeypatch.setattr(loading, "FETCH_MAIN", "import os; print('half a line', end=''); os._exit(9)")
    with pytest.raises(ValueError, match=r"cannot download model 'org/m': the download ended with code 9 "
                                         r"\(no message\): run again"):
        loading.fetch_apart("org/m")

    monkeypatch.setattr(loading, "FETCH_MAIN", "import time; time.sleep(30)")
    monkeypatch.setattr(loading, "FETCH_SECONDS", 1)
    with pytest.raises(ValueError, match=r"the download took over 0 minutes: run again to resume it"):
        loading.fetch_apart("org/m")  # stopped at its time, not waited for


@pytest.mark.parametrize("on_zerogpu", [True, False])
def test_on_zerogpu_a_cached_pair_loads_without_asking_the_hub(monkeypatch, on_zerogpu):
    """On ZeroGPU the app's process downloads a pair before its job (app.fetched): the worker's
    load then asked the hub again for every file (a HEAD each, the model's info), on the visitor's
    GPU seconds. A cached model there loads from the cache alone; elsewhere the load asks as before
    (a newer revision on the hub is seen)."""
    import transformers

    from specviz import loading

    asked = []

    def from_pretrained(where, **kwargs):
        asked.append(kwargs.get("local_files_only", False))
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(presets, "hub_reachable", lambda: True)
    monkeypatch.setattr(loading, "bound_hub_requests", lambda: None)
    monkeypatch.setattr(presets, "is_cached", lambda name: name == "org/cached")
    if on_zerogpu:
        monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    else:
        monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    for name in ("org/cached", "org/new"):
        with pytest.raises(ValueError, match="stop here"):
            loading.load_model(name, "cpu", None)
    assert asked == ([True, False] if on_zerogpu else [False, False])


def test_a_model_typed_in_that_would_download_past_the_bound_is_refused_before_it(hub_cache, monkeypatch,
                                                                                   model_dirs):
    """With custom models on, one large repository typed in filled the server's disk, bounded only
    by the download's 30 minutes. What a load would download is now summed from the hub's listed
    sizes of the files it reads (files_to_fetch: not the ONNX copy, the README or the other
    frameworks' weights) and refused past SPECVIZ_MAX_DOWNLOAD_GB before anything downloads,
    on the way that loads (store.get) and on ZeroGPU's, which fetches first (store.fetching);
    the pair loaded stays. A preset is the operator's pick: not bounded."""
    import types

    import huggingface_hub

    from specviz import loading
    from specviz.settings import CUSTOM, RunSettings
    from specviz.store import ModelStore

    sizes = {"config.json": 700, "tokenizer.json": 7_000_000, "model.safetensors.index.json": 30_000,
             "model-00001-of-00002.safetensors": 9_000_000_000, "model-00002-of-00002.safetensors":
             6_000_000_000, "onnx/model.onnx": 30_000_000_000, "README.md": 5_000, "flax_model.msgpack": 15e9}
    hub_cache.repos = {"org/big": list(sizes)}
    asked = []

    def model_info(self, repo_id, files_metadata=False):
        asked.append((repo_id, files_metadata))
        files = [types.SimpleNamespace(rfilename=f, size=n) for f, n in sizes.items()]
        return types.SimpleNamespace(siblings=files)

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    whole = 700 + 7_000_000 + 30_000 + 15_000_000_000  # by hand: config, tokenizer, index, shards
    assert loading.download_bytes("org/big") == whole and asked == [("org/big", True)]
    loading.check_download("org/big", whole)  # at the bound: taken
    loading.check_download("org/big", None)  # no bound
    said = r"model 'org/big' would download 15.0 GB, past the 10 GB .*SPECVIZ_MAX_DOWNLOAD_GB.*: pick a "
    with pytest.raises(ValueError, match=said):
        loading.check_download("org/big", 10e9)
    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu",
                       max_download=10e9)
    tiny = store.get(RunSettings(pair="tiny", dtype="float32"))
    big = RunSettings(pair=CUSTOM, target="org/big", dtype="float32")
    with pytest.raises(ValueError, match=said):
        store.get(big)
    with pytest.raises(ValueError, match=said):
        list(store.fetching(big, lambda text: text))
    assert store.current() is tiny and hub_cache.calls == []  # nothing downloaded, the pair kept
    assert loading.download_bytes(str(model_dirs["target"])) is None  # a folder downloads nothing
