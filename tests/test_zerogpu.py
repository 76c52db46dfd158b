"""ZeroGPU: model work inside @spaces.GPU with a duration from the tokens; a no-op elsewhere."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import handler

from specviz import zerogpu


def test_off_zerogpu_the_decorator_leaves_the_function_alone(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    fn = lambda: 1  # noqa: E731
    assert not zerogpu.active() and zerogpu.gpu(60)(fn) is fn


def test_duration_grows_with_the_tokens_and_is_capped():
    assert zerogpu.duration(64) == int(20 + 0.1 * 64 * 2)  # a run and its baseline: 32 s
    assert zerogpu.duration(100, runs=1) == 30
    assert zerogpu.duration(10_000) == zerogpu.MAX_SECONDS
    # counts no setting check has seen yet: a huge one never reaches float(), a negative one asks
    # for the set-up alone, never for negative seconds
    assert zerogpu.duration(10 ** 400) == zerogpu.MAX_SECONDS and zerogpu.duration(-10 ** 6) == 20
    assert zerogpu.duration(64, load=True) == 32 + zerogpu.LOAD_SECONDS  # a pair to load first
    assert zerogpu.duration(10_000, load=True) == zerogpu.MAX_SECONDS


def test_on_zerogpu_jobs_ask_spaces_for_their_duration(monkeypatch):
    import spaces

    asked = []

    def fake_gpu(duration=None):
        asked.append(duration)
        return lambda fn: fn

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(spaces, "GPU", fake_gpu)
    assert zerogpu.active()
    assert zerogpu.gpu(zerogpu.duration(64))(sum)([1, 2]) == 3
    assert asked == [32]


def tiny_app(model_dirs, max_new_tokens: int):
    """(store, default settings, app) on the tiny pair, built with ZeroGPU's store settings after
    zerogpu.gpu was replaced: its jobs go through the stand-in."""
    import app
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu",
                       fast=zerogpu.FAST, warm=False, keep_home=True)
    default = RunSettings(pair="tiny", chat=False, max_new_tokens=max_new_tokens, prompt="def f",
                          dtype="float32")
    return store, default, app.build(store, Limits(), default)


def test_the_app_runs_its_model_work_through_the_gpu_decorator(monkeypatch, model_dirs):
    """A run on a ZeroGPU deployment: the model generator is wrapped, with the run's duration.
    Its jobs go through one function, decorated once when the app is built: spaces.GPU keeps a
    worker process per decorated function, so a job decorated per request forked (and kept) one
    per run, and a function per job kind gave the lab a worker (and a model store) of its own. The
    job's settings reach the worker as arguments, pickled, and its duration is computed from them."""
    import pickle


    decorated, asked = [], []

    def fake_gpu(seconds):  # what spaces.GPU does with a duration and the call's arguments
        def wrap(fn):
            decorated.append(fn)

            def call(*args, **kwargs):
                asked.append(seconds(*args, **kwargs) if callable(seconds) else seconds)
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))  # the worker's copy
                yield from fn(*args, **kwargs)
            return call
        return wrap

    monkeypatch.setattr(zerogpu, "gpu", fake_gpu)
    store, default, demo = tiny_app(model_dirs, max_new_tokens=12)
    run = handler(demo, "run")
    names = ("pair", "target", "draft", "proposer", "k", "temperature", "top_p", "top_k", "seed",
             "max_new_tokens", "prompt", "chat", "dtype", "nodes", "branching")
    values = [getattr(default, n) for n in names]
    assert len(decorated) == 1 and asked == []  # the run, the lab and the end-to-end check: one
    outputs = list(run(None, None, *values))
    assert outputs[-1][0].startswith("Done") and asked == [zerogpu.duration(12)]
    assert store.current().fast == "graphed"
    tree = [{"proposer": "tree", "max_new_tokens": 8}.get(n, v) for n, v in zip(names, values, strict=True)]
    last = list(run(None, None, *tree))[-1]
    assert last[0].startswith("Done")
    assert len(decorated) == 1 and asked == [zerogpu.duration(12), zerogpu.duration(8, runs=3)]
    # the lab's round (its trace crosses to the worker) and the end-to-end check, on the same workers
    key = last[-1]  # the newest run's trace (a session's newer run replaces its older one)
    lab_run = handler(demo, "lab_run")
    assert "specviz-lab" in list(lab_run("round", 2, 1000, ["exact"], key, None))[-1][0]
    e2e = handler(demo, "e2e_run")
    warm = [{"temperature": 0.8}.get(n, v) for n, v in zip(names, values, strict=True)]
    assert "specviz-lab" in list(e2e(None, 10, *warm))[-1]
    # 10 samples of k + 1 tokens each, speculative and alone
    assert len(decorated) == 1 and asked[2:] == [zerogpu.LAB_SECONDS, zerogpu.duration(10 * (default.k + 1))]
    # another dtype than the pair placed at start-up: the job may load it first, and asks for that
    other = [{"dtype": "bfloat16", "max_new_tokens": 4}.get(n, v) for n, v in zip(names, values, strict=True)]
    assert list(run(None, None, *other))[-1][0].startswith("Done")
    assert asked[4:] == [zerogpu.duration(4, load=True)] == [int(20 + 0.1 * 4 * 2 + zerogpu.LOAD_SECONDS)]
    # back to the page's pair: a fresh worker holds it, and one holding the other dtype switches
    # back to it without a load (the store keeps it: spaces holds its tensors in every worker)
    loads = len(store._loads)
    assert list(run(None, None, *values))[-1][0].startswith("Done")
    assert list(run(None, None, *values))[-1][0].startswith("Done")
    assert asked[5:] == [zerogpu.duration(12), zerogpu.duration(12)] and len(store._loads) == loads
    del asked[2:]
    # settings out of range are refused before the job asks for GPU time (or takes a gate place)
    import gradio as gr

    for bad in ({"max_new_tokens": 10 ** 400}, {"k": 999}):
        with pytest.raises(gr.Error):
            list(run(None, None, *[bad.get(n, v) for n, v in zip(names, values, strict=True)]))
    assert asked == [zerogpu.duration(12), zerogpu.duration(8, runs=3)]


def test_a_visitors_error_inside_a_zerogpu_job_keeps_its_message(monkeypatch, model_dirs):
    """ZeroGPU's worker hands back a gr.Error whole and any other exception as "ZeroGPU worker
    error" (spaces/zero/wrappers.py, exception_result): a ValueError naming the fix, raised in
    the job (the prompt too long, checked after encoding), reached the visitor without it."""
    import gradio as gr

    import app
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    def worker(seconds):  # what spaces.GPU does with what the job raises
        def wrap(job):
            def run(*args, **kwargs):
                try:
                    yield from job(*args, **kwargs)
                except gr.Error:
                    raise
                except Exception as e:
                    raise gr.Error(f"ZeroGPU worker error: {type(e).__name__}") from None
            return run
        return wrap

    monkeypatch.setattr(zerogpu, "gpu", worker)
    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu",
                       warm=False)
    default = RunSettings(pair="tiny", chat=False, max_new_tokens=4, prompt="def f " * 40, dtype="float32")
    demo = app.build(store, Limits(max_prompt_tokens=20), default)
    run = handler(demo, "run")
    names = ("pair", "target", "draft", "proposer", "k", "temperature", "top_p", "top_k", "seed",
             "max_new_tokens", "prompt", "chat", "dtype", "nodes", "branching")
    values = [getattr(default, n) for n in names]
    with pytest.raises(gr.Error, match=r"this deployment allows 20 .*shorten it"):
        list(run(None, None, *values))


def test_on_zerogpu_the_app_imports_spaces_before_torch(tmp_path):
    """spaces refuses to load once CUDA is initialised, and its torch patch is what lets the main
    process (no GPU on ZeroGPU) load the pair onto "cuda" at start-up; it was imported only inside
    the first job's decorator, after the preload."""
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "spaces"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import sys\nFIRST = 'torch' not in sys.modules and 'gradio' not in sys.modules\n")
    root = Path(__file__).parent.parent
    code = "import app, spaces; print(spaces.FIRST)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}", "SPACES_ZERO_GPU": "true"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


@pytest.mark.parametrize("text", ["suggested_hardware: zero-a10g", "spaces=="])
def test_the_space_is_set_up_for_zerogpu(text):
    from pathlib import Path

    root = Path(__file__).parent.parent
    assert text in (root / "README.md").read_text() + (root / "requirements.txt").read_text()


def test_the_k_explorer_takes_only_shipped_cost_profiles(model_dirs):
    import gradio as gr

    import app
    from specviz import profiles
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    demo = app.build(store, Limits(), RunSettings(pair="tiny", chat=False))
    explore = handler(demo, "explore")
    with pytest.raises(gr.Error, match="cost profile from the list"):
        explore(4, False, "../../etc/passwd", None)
    assert profiles.shipped()  # the CPU profile measured here
    numbers, text, fig = explore(4, False, profiles.shipped()[0], None)  # no run yet: a hint
    assert "Run at temperature 0" in numbers and fig is None


def test_a_worker_forked_while_a_lock_was_held_gets_a_free_one():
    """spaces forks its GPU worker from the app's process while request threads run: a lock one
    of them held at that moment (the model store's, the hub probe's) stayed held in the worker,
    whose next load or probe then waited until the job's GPU time ran out."""
    import threading

    from specviz import presets
    from specviz.store import ModelStore

    store = ModelStore(device="cpu")
    held, release = threading.Event(), threading.Event()

    def hold():
        with store._lock, presets._probe_lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the worker: both locks free
            ok = False
            try:
                ok = store._lock.acquire(timeout=2) and presets._probe_lock.acquire(timeout=2)
            finally:
                os._exit(0 if ok else 1)  # noqa: B012 - never return into the test session
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_on_zerogpu_a_default_pair_that_cannot_be_placed_stops_the_start(monkeypatch):
    """It printed the error and served: every job then loaded the pair inside its GPU time, where
    ZeroGPU wants it placed at start-up."""
    import app

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(zerogpu, "gpu", lambda seconds: (lambda fn: fn))  # spaces itself needs its server
    monkeypatch.setattr(app.ModelStore, "get", lambda self, s: (_ for _ in ()).throw(OSError("disk full")))
    monkeypatch.setattr(app.gr.Blocks, "launch", lambda *a, **kw: pytest.fail("served"))
    with pytest.raises(SystemExit, match="could not place the default pair on the GPU at start-up.*disk"):
        app.main([])


@pytest.mark.parametrize("on_zerogpu", [True, False])
def test_only_off_zerogpu_does_the_server_cap_its_time_spent_switching_pairs(monkeypatch, on_zerogpu):
    """The cap's refusal is an error inside a ZeroGPU job, after which spaces does not put the
    worker back (spaces/zero/wrappers.py): the next call's fresh worker holds the page's pair and no
    count, so the refusal threw away the loaded pair and its "try again in N s" was false."""
    import app
    from specviz.store import RELOAD_SHARE

    built = {}

    class Store(app.ModelStore):
        def __init__(self, *args, **kwargs):
            built.update(kwargs)
            raise SystemExit("built")

    if on_zerogpu:
        monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    else:
        monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setattr(app, "ModelStore", Store)
    with pytest.raises(SystemExit, match="built"):
        app.main([])
    assert built["switch_share"] == (None if on_zerogpu else RELOAD_SHARE)
    assert built["keep_home"] is on_zerogpu  # the page's pair stays on the GPU there anyway


def test_on_zerogpu_a_jobs_clock_ends_inside_the_gpu_time_it_asked_for(monkeypatch, model_dirs):
    """A job's clock was the deployment's 300 s while its call asked for 32 s: a run past its
    GPU time was aborted by spaces with all it had made, where one past its own clock stops with
    a status and its trace. The clock starts once the pair is loaded, so a load's time is left out."""
    import app
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    clocks = []
    monkeypatch.setattr(zerogpu, "active", lambda: True)
    monkeypatch.setattr(zerogpu, "gpu", lambda seconds: lambda fn: fn)
    monkeypatch.setattr(app, "run_views", lambda store, s, limits: clocks.append(limits.max_job_seconds)
                        or iter(()))
    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu",
                       warm=False)
    default = RunSettings(pair="tiny", chat=False, max_new_tokens=120, prompt="def f", dtype="float32")
    demo = app.build(store, Limits(max_job_seconds=25.0), default)
    run = handler(demo, "run")
    names = ("pair", "target", "draft", "proposer", "k", "temperature", "top_p", "top_k", "seed",
             "max_new_tokens", "prompt", "chat", "dtype", "nodes", "branching")
    for tokens, clock in ((120, 20 + 0.1 * 120 * 2 - 10), (10, 20 + 0.1 * 10 * 2 - 10), (500, 25.0)):
        values = [{"max_new_tokens": tokens}.get(n, getattr(default, n)) for n in names]
        list(run(None, None, *values))
        assert clocks.pop() == pytest.approx(min(clock, 25.0))  # and never past the deployment's


def test_on_zerogpu_gradios_queue_holds_what_the_guard_allows_and_runs_are_shorter(monkeypatch, model_dirs):
    """Gradio bounds a ZeroGPU Space's whole queue to one waiting event unless told otherwise: a
    second visitor's page load was refused while another waited. And the default bound on new
    tokens keeps a tree run's request within an anonymous visitor's 120 s a day."""
    import gradio.utils

    import app
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    monkeypatch.setattr(gradio.utils, "is_zero_gpu_space", lambda: True)
    limits = Limits()
    demo = app.build(ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu",
                                warm=False), limits, RunSettings(pair="tiny"))
    lines = {fn.concurrency_id for fn in demo.fns.values()}
    assert len(lines) >= 4 and demo._queue.max_size == app.QUEUE_PER_JOB * limits.queue_size * len(lines)
    monkeypatch.delenv("SPECVIZ_MAX_NEW_TOKENS", raising=False)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert Limits.from_env().max_new_tokens == zerogpu.MAX_NEW_TOKENS == 192
    assert 1.5 * zerogpu.duration(192, runs=3) <= 120
    monkeypatch.delenv("SPACES_ZERO_GPU")
    assert Limits.from_env().max_new_tokens == 512


NAMES = ("pair", "target", "draft", "proposer", "k", "temperature", "top_p", "top_k", "seed",
         "max_new_tokens", "prompt", "chat", "dtype", "nodes", "branching")


def zerogpu_app(monkeypatch, model_dirs, refuse=None):
    """The app with a stand-in for spaces.GPU that records each call's duration and runs the job
    in this process (spaces' worker, kept from call to call: the store is what the worker holds).
    refuse: a list; while it holds an exception, the next call raises it before the job reaches
    the worker (spaces.zero.client.schedule: quota exceeded, illegal duration, no GPU)."""

    asked = []

    def fake_gpu(seconds):
        def wrap(fn):
            def call(*args, **kwargs):
                asked.append(seconds(*args, **kwargs))
                if refuse:
                    raise refuse.pop()
                yield from fn(*args, **kwargs)
            return call
        return wrap

    monkeypatch.setattr(zerogpu, "gpu", fake_gpu)
    store, default, demo = tiny_app(model_dirs, max_new_tokens=4)
    store.get(default)  # placed at start-up, as main() does on ZeroGPU

    def values(**over):
        return [over.get(n, getattr(default, n)) for n in NAMES]
    return demo, store, asked, values


def stop_while_loading(run, values) -> None:
    """A run on bfloat16 (another dtype than the worker holds), stopped while it loads."""
    job = run(None, None, *values(dtype="bfloat16"))
    for out in job:
        if str(out[0]).startswith("Loading"):
            break
    job.close()  # Stop, while the other dtype loads


def test_after_a_stop_the_next_job_asks_for_the_load_its_kept_worker_needs(monkeypatch, model_dirs):
    """Stop closes the job's generator: spaces then lets the worker end the job and keeps it for
    the next call (wrappers.generator_function_wrapper: stop_event, EndResult), where a load Stop
    interrupted goes on to its end. A job on the page's pair waits for it there, so it asks for a
    load's time though its own pair needs none (README: 60 s more where a load may come first),
    the lab's too; for a load's time after the stop, whatever came between: a call spaces refused
    reached no worker (the first version forgot the load at that call, and the next asked 20 s)."""
    import time

    import gradio as gr

    from specviz.settings import RunSettings

    monkeypatch.setattr(zerogpu, "LOAD_SECONDS", 8)  # a load's time: 8 s here
    refuse = []
    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs, refuse)
    run = handler(demo, "run")
    stop_while_loading(run, values)
    stopped = time.monotonic()
    end = stopped + 60
    while not store.is_loaded(RunSettings(pair="tiny", dtype="bfloat16")) and time.monotonic() < end:
        time.sleep(0.05)
    assert asked == [zerogpu.duration(4, load=True)]
    refuse.append(gr.Error("You have exceeded your free ZeroGPU quota", title="ZeroGPU quota exceeded"))
    with pytest.raises(gr.Error, match="quota"):
        list(run(None, None, *values()))
    assert list(run(None, None, *values()))[-1][0].startswith("Done")  # the page's pair: switched back
    key = list(run(None, None, *values()))[-1][16]
    list(handler(demo, "lab_run")("round", 1, 1000, ["exact"], key, None))
    assert time.monotonic() - stopped < 8, "the steps above took longer than the load's time"
    assert asked[1:] == [zerogpu.duration(4, load=True)] * 3 + [zerogpu.LAB_SECONDS + 8]
    time.sleep(max(0.0, stopped + 8 - time.monotonic()))  # a load's time after the stop: it has ended
    assert list(run(None, None, *values()))[-1][0].startswith("Done")
    assert asked[5:] == [zerogpu.duration(4)]


def test_a_run_right_after_a_stop_during_a_load_asks_for_the_rest_of_that_load(monkeypatch, model_dirs):
    """Stopped while its worker loads, a job leaves the load going on there. The next job on the
    same settings waits for that load, so it must ask for a load's time; it asked for the run's
    alone and could overrun its GPU time ("GPU task aborted", told to ask for fewer tokens). A job
    on another pair than the page's asks for a load whatever came before: its call may get a fresh
    worker, which holds the page's pair (spaces forks one unless the GPU it picks has an idle one)."""
    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs)
    run = handler(demo, "run")
    stop_while_loading(run, values)
    assert list(run(None, None, *values(dtype="bfloat16")))[-1][0].startswith("Done")
    assert asked == [zerogpu.duration(4, load=True)] * 2
    job = run(None, None, *values(dtype="bfloat16"))
    next(job)
    job.close()  # Stop, with the pair loaded
    list(run(None, None, *values(dtype="bfloat16")))
    assert asked[2:] == [zerogpu.duration(4, load=True)] * 2


def test_a_load_is_under_way_from_the_moment_its_job_says_loading(monkeypatch, model_dirs):
    """The worker says SETTLED once no load is under way; the load's thread may not have taken the
    store's lock yet when the job first says "Loading…" (29 of 2,000 tries on this machine), and
    then a Stop left the worker's pair known while its load went on."""
    import threading
    import time

    store, default, _ = tiny_app(model_dirs, 4)
    get, go = store.get, threading.Event()

    def slow_get(s, stopped=None):
        go.wait(5)  # the thread has started, the lock is not yet taken
        return get(s, stopped)

    monkeypatch.setattr(store, "get", slow_get)
    job = store.loading(default, "Loading…")
    assert next(job) == "Loading…" and store.load_under_way()
    go.set()
    with pytest.raises(StopIteration):
        while True:
            next(job)
    end = time.monotonic() + 5
    while store.load_under_way() and time.monotonic() < end:  # the thread's last step
        time.sleep(0.01)
    assert not store.load_under_way()


def test_what_a_job_asks_for_does_not_hang_on_which_worker_the_last_one_had(monkeypatch, model_dirs):
    """spaces refuses a call before it reaches a worker (its quota, its duration, no GPU free),
    forks a fresh worker after a job that raised, and reuses a GPU's worker only where the one it
    picks is idle: which worker a call gets, and so what it holds, is unknown when it asks. A job
    asks for a load where its pair is not the page's, and for none where it is (a worker holding
    another switches back without one)."""
    import gradio as gr

    refuse = []
    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs, refuse)
    run = handler(demo, "run")
    assert list(run(None, None, *values(dtype="bfloat16")))[-1][0].startswith("Done")
    refuse.append(gr.Error("You have exceeded your free ZeroGPU quota (90s requested vs. 50s left). "
                           "Try again in 0:21:00.", title="ZeroGPU quota exceeded", print_exception=False))
    with pytest.raises(gr.Error, match="quota"):
        list(run(None, None, *values(dtype="bfloat16", max_new_tokens=200)))
    loads = len(store._loads)
    assert list(run(None, None, *values()))[-1][0].startswith("Done")  # the worker held bfloat16
    assert len(store._loads) == loads  # switched back to the kept page's pair: no load
    assert asked == [zerogpu.duration(4, load=True), zerogpu.duration(200, load=True), zerogpu.duration(4)]
    # a visitor's error raised in the worker (a prompt too long): spaces forks a fresh worker next,
    # holding the page's pair, so a run on it asks for no load
    with pytest.raises(gr.Error, match="prompt"):
        list(run(None, None, *values(prompt="def f " * 400)))
    assert list(run(None, None, *values()))[-1][0].startswith("Done")
    assert asked[3:] == [zerogpu.duration(4), zerogpu.duration(4)]


def test_a_job_zerogpu_aborts_tells_the_visitor_what_to_do(monkeypatch, model_dirs):
    """A job past its GPU time (a load that took longer than asked for, a slow worker start) is
    killed by ZeroGPU, and spaces raises gr.Error("GPU task aborted") (wrappers: AbortedResult):
    the page's status said only "⚠ GPU task aborted", nothing of why or of what to do."""
    import gradio as gr
    from spaces.zero.gradio import error

    import app

    abort_at = [3]  # STARTED, SETTLED, the run's first view: mid-run

    def aborting_gpu(seconds):
        def wrap(fn):
            def call(*args, **kwargs):
                seconds(*args, **kwargs)  # spaces asks for it before the call
                for n, out in enumerate(fn(*args, **kwargs)):
                    if n == abort_at[0]:
                        raise error("ZeroGPU worker error", "GPU task aborted")
                    yield out
            return call
        return wrap

    monkeypatch.setattr(zerogpu, "gpu", aborting_gpu)
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu",
                       warm=False)
    default = RunSettings(pair="tiny", chat=False, max_new_tokens=8, prompt="def f", dtype="float32")
    demo = app.build(store, Limits(), default)
    store.get(default)  # placed at start-up: the job runs at once (no load thread left behind)
    run = handler(demo, "run")
    outs = []
    with pytest.raises(gr.Error) as raised:
        for out in run(None, None, *[getattr(default, n) for n in NAMES]):
            outs.append(out)
    assert "fewer new tokens" in raised.value.message and str(zerogpu.duration(8)) in raised.value.message
    assert "fewer new tokens" in outs[-1][0]  # the status says it too
    # aborted while its worker loaded another dtype (STARTED, then "Loading…"): fewer tokens would
    # not help, and the page said to pick them
    abort_at[0] = 2
    other = [{"dtype": "bfloat16"}.get(n, getattr(default, n)) for n in NAMES]
    with pytest.raises(gr.Error) as raised:
        list(run(None, None, *other))
    assert "while its worker was still loading a pair" in raised.value.message
    assert str(zerogpu.duration(8, load=True)) in raised.value.message and "fewer" not in raised.value.message


def test_the_built_in_lab_example_asks_for_no_gpu_time(monkeypatch, model_dirs):
    """The Exactness lab's built-in example uses no model (labview.example: three tokens' p and q,
    sampled on the CPU), yet went through @spaces.GPU asking 30 s: it waited in ZeroGPU's queue,
    and a visitor whose GPU quota was spent was refused it."""
    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs)
    lab_run = handler(demo, "lab_run")
    assert "specviz-lab" in list(lab_run("example", 1, 1000, ["exact"], None, None))[-1][0]
    assert asked == []


def hub_pair(monkeypatch, store, fetched: list, go):
    """Pair "hub" (the tiny pair's folders standing for hub ids whose files are not cached): each
    model's download, in store.fetch_apart, waits for `go` and is recorded in `fetched`; it fails with
    the exception in go.failure, if any."""
    import app
    import specviz.store as store_module

    store.extra_pairs["hub"] = tuple(f"{name}/" for name in store.extra_pairs["tiny"])  # other names
    cached = set()

    def fetch(name):
        fetched.append(name)
        go.wait(30)
        if getattr(go, "failure", None) is not None:
            raise go.failure
        cached.add(name)

    needs = lambda name: name.endswith("/") and name not in cached  # noqa: E731
    for module in (app, store_module):
        monkeypatch.setattr(module, "needs_fetch", needs)
    monkeypatch.setattr(store_module, "fetch_apart", fetch)


def test_on_zerogpu_a_first_download_comes_before_the_gpu_time_a_job_asks_for(monkeypatch, model_dirs):
    """A pair's first load downloaded its files inside the job: on the visitor's GPU seconds, and
    a large preset's outlasted the 60 s asked for a load ("GPU task aborted"). The app's process
    now downloads first, saying so, and asks for GPU time once the files are cached; a Stop lets
    go and the download goes on, and a job asking meanwhile waits on it rather than starting
    another."""
    import threading

    from specviz.settings import markdown_text

    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    fetched, go = [], threading.Event()
    hub_pair(monkeypatch, store, fetched, go)
    run = handler(demo, "run")
    job = run(None, None, *values(pair="hub"))
    status = next(job)[0]
    assert status.startswith("Downloading ") and "no GPU time is spent on it" in status and asked == []
    job.close()  # Stop
    again = run(None, None, *values(pair="hub"))
    assert next(again)[0].startswith("Downloading ")
    other = SimpleNamespace(client=SimpleNamespace(host="203.0.113.9"), headers={}, session_hash="b")
    behind = run(other, None, *values(pair="hub"))  # another visitor: downloads are one at a time
    assert next(behind)[0] == markdown_text("waiting for the downloads asked for before yours: 1 ahead "
                                            "of you (Stop leaves the line)")
    behind.close()
    again.close()  # Stop again: the download goes on, and the next pair's waits for it
    store.extra_pairs["hub3"] = ("org/third/", None)
    third = run(other, None, *values(pair="hub3", proposer="ngram"))
    assert next(third)[0].startswith(markdown_text("Waiting for another download to end before "))
    assert "/target" not in next(third)[0]  # not the other visitor's pick
    assert fetched == [store.extra_pairs["hub"][0]]  # the hub pair's target alone: one at a time
    third.close()
    again = run(other, None, *values(pair="hub"))
    assert next(again)[0].startswith("Downloading ")
    with pytest.raises(Exception, match="busy: you already have a job waiting or running"):
        list(handler(demo, "e2e_run")(other, 10, *values(temperature=1.0)))  # the same page's, cached
    go.set()
    assert list(again)[-1][0].startswith("Done")
    assert sorted(fetched) == sorted(store.extra_pairs["hub"])  # each model once
    assert asked == [zerogpu.duration(4, load=True)]
    shown = [out[0] for out in run(None, None, *values(pair="hub"))]  # cached now
    assert shown[-1].startswith("Done") and not any("Downloading" in str(status) for status in shown)
    e2e = handler(demo, "e2e_run")
    store.extra_pairs["hub2"] = store.extra_pairs["tiny"]
    monkeypatch.setattr(store, "model_names", lambda s: ("org/new/",) if s.pair == "hub2" else ())
    go.clear()
    go.failure = ValueError("cannot download model 'org/new': 404 Not Found: run again to resume")
    threading.Timer(0.5, go.set).start()
    with pytest.raises(Exception, match="cannot download model 'org/new': 404"):
        list(e2e(None, 10, *values(pair="hub2", temperature=1.0)))
    assert len(asked) == 2, "a failed download asked for no GPU time"
    tries = len(fetched)  # within a minute it is said again, not tried again (each try a process)
    with pytest.raises(Exception, match="cannot download model 'org/new': 404"):
        list(run(None, None, *values(pair="hub2")))
    assert len(fetched) == tries


def test_off_zerogpu_nothing_is_downloaded_before_a_job(monkeypatch, model_dirs):
    import threading

    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs)
    fetched, go = [], threading.Event()
    hub_pair(monkeypatch, store, fetched, go)
    go.set()
    assert list(handler(demo, "run")(None, None, *values(pair="hub")))[-1][0].startswith("Done")
    assert fetched == []  # the load downloads, as before


def test_on_zerogpu_the_lab_loads_the_pair_its_round_was_run_on(monkeypatch, model_dirs):
    """A job's worker is not the visitor's to choose: a fresh one holds the page's pair. The lab
    read the loaded pair, so a round of a run on another pair or dtype was refused there ("run it
    here first"), however often the visitor ran it. On ZeroGPU the lab now loads the run's pair,
    asking for a load's time where that is not the page's; elsewhere it never switches the pair."""
    from specviz.settings import RunSettings

    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    run, lab_run = handler(demo, "run"), handler(demo, "lab_run")
    key = list(run(None, None, *values(dtype="bfloat16")))[-1][16]
    home = RunSettings(pair="tiny", dtype="float32")
    store.get(home)  # the next call's worker: a fresh one, holding the page's pair
    shown = list(lab_run("round", 1, 1000, ["exact"], key, None))
    assert "Loading the run's pair" in shown[0][0] and "Monte Carlo" in str(shown[-1][2])
    assert asked == [zerogpu.duration(4, load=True), zerogpu.LAB_SECONDS + zerogpu.LOAD_SECONDS]
    assert store.is_loaded(RunSettings(pair="tiny", dtype="bfloat16"))
    key = list(run(None, None, *values()))[-1][16]  # the page's pair: no load asked for
    list(lab_run("round", 1, 1000, ["exact"], key, None))
    assert asked[2:] == [zerogpu.duration(4), zerogpu.LAB_SECONDS]
    key = list(run(None, None, *values(dtype="bfloat16")))[-1][16]
    saved = json.loads(Path(handler(demo, "save")(key, None)).read_text())
    saved["models"]["dtype"] = "float16"  # its settings say bfloat16, its models another dtype
    edited = Path(store.extra_pairs["tiny"][0]).parent / "edited.json"
    edited.write_text(json.dumps(saved))
    key = list(handler(demo, "open_trace")(str(edited), None))[-1][16]
    store.get(home)
    with pytest.raises(Exception, match="run it here first"):  # no load asked for, none made
        list(lab_run("round", 1, 1000, ["exact"], key, None))
    assert asked[-1] == zerogpu.LAB_SECONDS and store.is_loaded(home)
    monkeypatch.delenv("SPACES_ZERO_GPU")
    store.get(RunSettings(pair="tiny", dtype="bfloat16"))  # off ZeroGPU: the loaded pair is read
    with pytest.raises(Exception, match="run it here first"):
        list(lab_run("round", 1, 1000, ["exact"], key, None))


def test_a_trace_is_not_opened_over_a_run_that_downloads_its_pair(monkeypatch, model_dirs):
    """Open refuses while the page's run streams (its end would replace the trace opened); on
    ZeroGPU a run first waits in the download line, where Open was let through."""
    import threading

    demo, store, asked, values = zerogpu_app(monkeypatch, model_dirs)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    fetched, go = [], threading.Event()
    hub_pair(monkeypatch, store, fetched, go)
    page = SimpleNamespace(client=SimpleNamespace(host="203.0.113.9"), headers={}, session_hash="p")
    run = handler(demo, "run")
    key = list(run(page, None, *values()))[-1][16]
    saved = handler(demo, "save")(key, page)
    job = run(page, None, *values(pair="hub"))
    assert next(job)[0].startswith("Downloading ")
    with pytest.raises(Exception, match="this page has a job under way"):
        list(handler(demo, "open_trace")(saved, page))
    job.close()
    go.set()
    assert list(handler(demo, "open_trace")(saved, page))[-1][-1].startswith("Opened: ")
