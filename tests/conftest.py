"""The tests' fixtures and helpers; the tiny offline models themselves (tokenizer, random configs, noisy
drafts) are in tiny.py, which needs no pytest, re-exported here."""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("SPACE_ID", None)  # a Space changes deployment defaults; tests that need one set it
# each test process its own Gradio cache (uploads, saved files, Gradio's empty temporary files):
# two workers' servers shared /tmp/gradio, where one's hooks.Tidy could sweep what the other's
# upload had just made. Removed when the process ends. Inside GRADIO_TEMP_DIR where one is set,
# made if missing (Gradio makes it; the docs' scripts that import this module failed on it)
if os.environ.get("GRADIO_TEMP_DIR"):
    os.makedirs(os.environ["GRADIO_TEMP_DIR"], exist_ok=True)
_GRADIO_CACHE = tempfile.TemporaryDirectory(prefix="specviz-tests-gradio-",
                                            dir=os.environ.get("GRADIO_TEMP_DIR"))
os.environ["GRADIO_TEMP_DIR"] = _GRADIO_CACHE.name

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import EOS, make_model, make_tokenizer, perturbed  # noqa: E402, F401 - the tests' and docs' imports

if os.environ.get("PYTEST_XDIST_WORKER"):  # one torch thread per worker: two workers share 2 cores
    torch.set_num_threads(1)
    # and so do the processes a test starts (the quick gpucheck): two threads that wait on each
    # other beside the other worker took 8 ms a tiny matrix product, and the check 70 s, not 10
    os.environ["OMP_NUM_THREADS"] = "1"



@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """With -n and no --dist: each worker starts on its half of the suite in order, and one that
    runs out takes over the other's last pending tests. ("load" hands out small batches to whichever
    worker is free, so one module's tests, and its module-scoped fixtures with them, the app builds
    and the quick gpucheck's 10 s run among them, could be made in both workers.) Here and not in
    pyproject's addopts, where `-p no:xdist` stopped on the unknown --dist option."""
    given = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    chosen = any(a == "--dist" or a.startswith("--dist=") for a in given)
    if getattr(config.option, "dist", "no") == "load" and not chosen:
        config.option.dist = "worksteal"


@pytest.fixture(autouse=True)
def fresh_verify_lines(monkeypatch):
    """Each test starts with the target's verify line unmeasured (verifycost.VerifyCost.of keeps
    one per target model, fed by every run but the n-gram's own): what the n-gram rule and the
    sizing drafters price a token at must not depend on the tests that ran before."""
    import weakref

    from specviz import verifycost

    monkeypatch.setattr(verifycost, "_COSTS", weakref.WeakKeyDictionary())


def long_pair(noise: float) -> Path:
    """A folder holding a tiny target and a draft (its copy with noise added) under target/ and
    draft/, with the tests' tokenizer and room for 512+ new tokens (the tests' models have 256
    positions): the docs' scripts that measure a long run (stream-bytes.py, rounds-memory.py)."""
    out = Path(tempfile.mkdtemp())
    tok = make_tokenizer(out)
    target = make_model("qwen2", len(tok), 0, tok.convert_tokens_to_ids(EOS), positions=1024)
    for name, m in (("target", target), ("draft", perturbed(target, 1, noise))):
        m.save_pretrained(out / name)
        tok.save_pretrained(out / name)
    return out


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Saved tiny models: {name: folder}. The draft shares the tokenizer; 'padded' has 16 more rows."""
    root = tmp_path_factory.mktemp("models")
    tok = make_tokenizer(root)
    vocab, eos = len(tok), tok.convert_tokens_to_ids(EOS)
    target = make_model("qwen2", vocab, 0, eos)
    models = {
        "target": target,
        "draft": perturbed(target, 1, 0.05),
        "gpt2-target": make_model("gpt2", vocab, 2, eos),
    }
    models["gpt2-draft"] = perturbed(models["gpt2-target"], 3, 0.05)
    models["padded-draft"] = make_model("qwen2", vocab + 16, 4, eos)
    dirs = {}
    for name, model in models.items():
        dirs[name] = root / name
        model.save_pretrained(dirs[name])
        tok.save_pretrained(dirs[name])
    other = root / "other-tokenizer"
    make_model("qwen2", vocab, 5, eos).save_pretrained(other)
    from transformers import AutoTokenizer  # noqa: F401

    odd = make_tokenizer(root)
    odd.add_tokens(["fibonacci"])  # maps a common string to a different id
    odd.save_pretrained(other)
    dirs["other-tokenizer"] = other
    return dirs


@pytest.fixture(scope="session")
def pair(model_dirs):
    import specviz

    return specviz.load_pair(str(model_dirs["target"]), str(model_dirs["draft"]), device="cpu",
                             dtype="float32")


@pytest.fixture(scope="session")
def gpt2_pair(model_dirs):
    import specviz

    return specviz.load_pair(str(model_dirs["gpt2-target"]), str(model_dirs["gpt2-draft"]),
                             device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def static_pair(pair):
    """The tiny pair on the static-cache path (preallocated caches, rollback moves a length)."""
    from dataclasses import replace

    return replace(pair, fast="static")


@pytest.fixture(scope="session")
def compiled_pair(pair):
    """The tiny pair on the compiled path: static caches and torch.compile'd fixed-shape steps.
    On this CPU the "aot_eager" backend captures the same graphs without generating C++ (the
    inductor backend takes about 100 s a shape on 2 cores); on CUDA gpucheck runs the real one."""
    import copy
    from dataclasses import replace

    from specviz import fastpath

    fastpath.COMPILE = {"backend": "aot_eager", "dynamic": False}
    return replace(pair, target=copy.deepcopy(pair.target), draft=copy.deepcopy(pair.draft),
                   fast="compiled")


class RerunGraphs:
    """CPU stand-ins for fastpath.GraphedStep's CUDA pieces: no side stream, and a "graph" whose replay
    reruns the recorded call into one output buffer made at capture (as a graph's is). `stale`
    also rewinds the cache to where it stood at capture before each replay, as a graph that
    baked its position in would."""

    stale = False

    @staticmethod
    def warm_stream(self):
        import contextlib

        return contextlib.nullcontext()

    @classmethod
    def record(cls, self, run, like):
        out = torch.empty_like(like)
        free = dict(zip(run.__code__.co_freevars, run.__closure__, strict=True))
        cache = free["cache"].cell_contents  # the cache GraphedStep._capture's run() writes
        at = int(cache.get_seq_length())

        def replay():
            if cls.stale:
                from specviz.kvcache import crop

                crop(cache, at - int(cache.get_seq_length()))
            out.copy_(run())

        return replay, out


@pytest.fixture
def cpu_graphs(monkeypatch):
    """fastpath.GraphedStep on CPU, with RerunGraphs standing in for the CUDA graphs."""
    from specviz import fastpath

    monkeypatch.setattr(fastpath, "GRAPH_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(fastpath.GraphedStep, "warm_stream", lambda self: RerunGraphs.warm_stream(self))
    monkeypatch.setattr(fastpath.GraphedStep, "record",
                        lambda self, run, like: RerunGraphs.record(self, run, like))
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())  # slots made here hold GraphedSteps
    return RerunGraphs


@pytest.fixture
def graphed_pair(pair, cpu_graphs):
    """The tiny pair on the graphed path (ZeroGPU's): static caches, the fixed-shape steps through
    fastpath.GraphedStep, with RerunGraphs standing in for CUDA graphs on this CPU."""
    from dataclasses import replace

    return replace(pair, fast="graphed")


@contextlib.contextmanager
def fails_once(module, message: str = "replay failed", error: type = RuntimeError):
    """module raises error(message) once, after its forward ran (a step failing part-way: the
    layers before it written, the rest not), then works again; yields the list that records it."""
    failed = []

    def hook(mod, args, output):
        if not failed:
            failed.append(True)
            raise error(message)

    handle = module.register_forward_hook(hook)
    try:
        yield failed
    finally:
        handle.remove()


READ_BACKS = {"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "nonzero", "cpu", "numpy"}


def hf_greedy(pair, prompt, n):
    """transformers' greedy output of the pair's target: n tokens after the prompt."""
    ids = pair.encode(prompt)
    out = pair.target.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                               min_new_tokens=n)
    return out[0, len(ids):].tolist()


class CountReadBacks(torch.overrides.TorchFunctionMode):
    """Counts the tensor methods that read the device back (READ_BACKS) while it is active. One
    class for every count: dynamo guards a compiled step on the type of each mode active when it
    runs, so a class made anew per count had the compiled steps recompiled at every run (7 s a
    run on the tiny pair's compiled path), not the count's business. Nor is the count read while
    dynamo traces a step (a read inside a graph breaks it, and the break runs eagerly, counted):
    it guarded the step on the count's value, compiled again at every value."""

    n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not torch.compiler.is_compiling():
            self.n += getattr(func, "__name__", "") in READ_BACKS
        return func(*args, **(kwargs or {}))


def slowed(monkeypatch, owner, name: str, seconds: float) -> None:
    """owner.name, a generator function, made to sleep `seconds` after each item it yields."""
    real = getattr(owner, name)

    def slow(*a, **kw):
        for item in real(*a, **kw):
            time.sleep(seconds)
            yield item

    monkeypatch.setattr(owner, name, slow)


def slow_rounds(monkeypatch, seconds: float = 0.05) -> None:
    """The in-process app's rounds slowed, so that a run is still streaming when the test acts on
    it: on a busy machine the tiny pair finished a 200-token run before a cancel or click landed."""
    from specviz import service

    slowed(monkeypatch, service, "generate", seconds)


def wait_until(condition, seconds: float = 20.0) -> bool:
    """Whether condition() held within `seconds` (asked every 50 ms)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def read_backs_per_round(events) -> list[int]:
    """Device-to-host reads (each a host sync on a GPU) of every round after the first (which
    carries the prompt), counted on any device by intercepting the tensor methods that read."""
    events, counts = iter(events), []
    next(events)
    while True:
        with CountReadBacks() as count:
            if next(events, None) is None:
                return counts
        counts.append(count.n)


class FakeTime:
    """A perf_counter that moves only when a fake pass or copy says so."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class TimedPasses:
    """An lm whose passes take the given seconds on a FakeTime."""

    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.fed, self.rolled = clock, list(seconds), [], []

    def forward(self, ids, last=1):
        self.fed.append((list(ids), last))
        self.clock.now += self.seconds[len(self.fed) - 1]

    def rollback(self, ids):
        self.rolled.append(list(ids))


def handler(demo, name: str):
    """An app event's function by its name (the Python function's), to call as Gradio does."""
    return next(fn.fn for fn in demo.fns.values() if fn.name == name)


def finished(steps):
    """A generator run to its end: what it returns (labview.from_round_steps: p, q, labels,
    drafted, note)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
