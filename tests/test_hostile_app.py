"""A public Space is hostile ground: every handler is callable with any arguments, every trace
field is attacker-chosen, and one visitor must not crowd out the rest. These tests play the
attacker against the app on tiny models (loopback only)."""

import json
import math
import os
import re
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import finished, handler, slow_rounds, slowed, wait_until

from specviz import presets
from specviz.gate import BUSY, Busy, Gate
from specviz.settings import Limits, RunSettings, from_query, markdown_text, settings_from

FIELDS = ["pair", "target", "draft", "proposer", "k", "temperature", "top_p", "top_k", "seed",
          "max_new_tokens", "prompt", "chat", "dtype", "nodes", "branching"]


def args(**over):
    s = {"pair": "tiny", "target": "", "draft": "", "proposer": "draft", "k": 3, "temperature": 0.0,
         "top_p": 1.0, "top_k": 0, "seed": 0, "max_new_tokens": 8, "prompt": "def fibonacci(n):",
         "chat": False, "dtype": "float32", "nodes": 0, "branching": 3} | over
    return [s[name] for name in FIELDS]


@pytest.fixture(scope="module")
def demo(model_dirs):
    from test_app import free_port

    import app
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    limits = Limits(max_new_tokens=200)
    demo = app.build(store, limits, RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                **app.launch_options(demo))
    demo.url = f"http://127.0.0.1:{port}/"
    yield demo
    demo.close()


def client(demo):
    from gradio_client import Client

    return Client(demo.url, verbose=False)


def raw_call(demo, api_name: str, values: list) -> str:
    """POST values (NaN included: Python's JSON writes it, gradio_client refuses to) to the REST
    API as an attacker would, and return the event stream's text."""
    import httpx

    body = json.dumps({"data": values})  # allow_nan: NaN goes out as the bare word NaN
    r = httpx.post(f"{demo.url}gradio_api/call/{api_name}", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    if r.status_code != 200:
        return f"event: error\ndata: HTTP {r.status_code}"
    event = r.json()["event_id"]
    return httpx.get(f"{demo.url}gradio_api/call/{api_name}/{event}", timeout=60).text


# --- every argument coerced at the boundary ---------------------------------------------------

HOSTILE_RUN = [
    ("k", None, "k is missing"), ("k", math.nan, "k must be a whole number"),
    ("k", 10**30, r"k must be in 1\.\.16"), ("k", "four", "k must be a whole number"),
    ("k", [4], "k must be a whole number, got list"), ("k", 2.5, "k must be a whole number"),
    ("temperature", math.nan, "temperature must be a finite number"),
    ("temperature", 10**30, r"temperature must be 0 \(greedy\) or in"),
    ("temperature", 1e-30, r"temperature must be 0 \(greedy\) or in 0\.01"),
    ("temperature", "hot", "temperature must be a number"), ("top_p", 0, r"top_p must be in \(0, 1\]"),
    ("top_k", -1, "top_k must be in"), ("top_k", 10**30, "top_k must be in"),
    ("seed", -1, r"seed must be in 0\.\.4294967295"), ("seed", 2**32, "seed must be in"),
    ("seed", 10**30, "seed must be in"), ("max_new_tokens", 0, r"max new tokens must be in 1\.\.200"),
    ("max_new_tokens", None, "max new tokens is missing"),
    ("max_new_tokens", 10**30, "max new tokens must be in"),
    ("prompt", None, "the prompt is empty"), ("prompt", 12345, "prompt must be text"),
    ("prompt", {"text": "hi"}, "prompt must be text, got dict"),
    ("prompt", "x" * 20_000, "prompt has 20000 characters"),
    ("chat", "maybe", "chat must be true or false"), ("pair", None, "pair is missing"),
    ("pair", 7, "pair must be text"), ("pair", "<img src=x>", "unknown pair '(&lt;|<)img src=x(&gt;|>)'"),
    ("proposer", "evil", "unknown drafter 'evil'"), ("dtype", "float64", "dtype must be one of"),
    ("pair", "qwen2.5-7b", "too large for this machine|off on this deployment|unknown pair"),
    ("nodes", 65, r"tree nodes must be in 0\.\.64 \(0 sizes each round's tree from the measured verify"),
    ("nodes", -1, r"tree nodes must be in 0\.\.64"), ("nodes", math.nan, "tree nodes must be a whole number"),
    ("nodes", "many", "tree nodes must be a whole number"), ("nodes", [8], "whole number, got list"),
    ("branching", -1, r"tree branching must be in 0\.\.8 \(0 widens the tree from 3 children while it "
                      r"fills\), got -1"), ("branching", 10**30, "tree branching"),
    ("branching", 2.5, "tree branching must be a whole number"),
]


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_RUN)
def test_settings_from_turns_any_hostile_value_into_a_message_naming_the_fix(field, value, message):
    values = dict(zip(FIELDS, args(**{field: value}), strict=True))
    limits = Limits(max_new_tokens=200)
    with pytest.raises(ValueError, match=message):
        settings_from(values, limits).check(limits, {"tiny"} | set(presets.BY_KEY))


# values a JSON call can send that the page's own controls cannot: checked at settings_from only
HOSTILE_VALUES = [
    ("k", True, "k must be a whole number, got bool"), ("seed", False, "seed must be a whole number"),
    ("max_new_tokens", True, "max new tokens must be a whole number, got bool"),
    ("chat", 5, "chat must be true or false, got '5'"), ("chat", -1, "chat must be true or false"),
    ("chat", 10**30, "chat must be true or false"),
    ("target", "a/" + "b" * 1001, "target has 1003 characters; this deployment allows 1000: shorten it"),
    ("draft", "d" * 1001, "draft has 1001 characters"),
]


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_VALUES,
                         ids=[f"{f}={str(v)[:12]}" for f, v, _ in HOSTILE_VALUES])
def test_settings_from_refuses_a_bool_for_a_number_and_overlong_names(field, value, message):
    limits = Limits(allow_custom=True)
    values = dict(zip(FIELDS, args(**{"pair": "custom", "target": "a/b"} | {field: value}), strict=True))
    with pytest.raises(ValueError, match=message):
        settings_from(values, limits)


def test_a_link_whose_pair_is_refused_drops_its_target_and_draft_too():
    """pair=nope&target=evil/model where custom models are allowed: the pair falls back to the
    page's, and so must the target and draft that came with it."""
    from specviz.settings import RunSettings, from_query

    s, notices, run = from_query({"pair": "nope", "target": "evil/model", "draft": "evil/draft", "run": "1"},
                                 RunSettings(), Limits(allow_custom=True), set(presets.BY_KEY))
    assert (s.pair, s.target, s.draft) == (RunSettings().pair, RunSettings().target, RunSettings().draft)
    assert any("ignored link parameter pair" in n for n in notices) and not run


def test_a_prompt_with_a_lone_surrogate_is_refused_with_the_fix(demo):
    """Python's JSON reads "\\ud800" into a string no tokenizer takes: refused at the settings, in a
    message, not a TypeError from the tokenizer."""
    values = dict(zip(FIELDS, args(prompt="abc\ud800def"), strict=True))
    with pytest.raises(ValueError, match="prompt holds a lone surrogate"):
        settings_from(values, Limits()).check(Limits(), {"tiny"})
    for chat in (False, True):
        stream = raw_call(demo, "run", args(prompt="abc\ud800def", chat=chat))
        assert "event: error" in stream and "lone surrogate" in stream, stream
    assert "lone surrogate" not in raw_call(demo, "run", args(prompt="abc \U0001f600 def", max_new_tokens=2))


def test_every_model_endpoint_gives_a_clean_error_for_hostile_values_and_keeps_serving(demo):
    from gradio_client.exceptions import AppError

    c = client(demo)
    for field, value, message in HOSTILE_RUN:
        if isinstance(value, float) and math.isnan(value):
            stream = raw_call(demo, "run", args(**{field: value}))
            assert "event: error" in stream and re.search(message, stream), stream
            continue
        with pytest.raises(AppError, match=message):
            c.predict(*args(**{field: value}), api_name="/run")
    lab = [("example", math.nan, "trials", "trials must be a whole number"),
           ("example", 10**30, "trials", r"trials must be in 1000\.\.1000000"),
           (5, 2000, "source", "distributions must be one of"),
           ("example", 2000, "variants", "variants must be a list"),
           ("round", 2000, "round", "round must be a whole number")]
    import httpx

    # text past four prompts' worth is refused before Gradio keeps it in the page's state
    r = httpx.post(f"{demo.url}gradio_api/call/run", json={"data": args(prompt="x" * 100_000)}, timeout=10)
    assert r.status_code == 400 and "too much text in one call: at most 32384" in r.json()["detail"]
    huge = [[10**4299] * 10] * 10  # 100 of the longest ints JSON parses: 430 K characters of digits
    r = httpx.post(f"{demo.url}gradio_api/call/run", json={"data": args(k=huge)}, timeout=10)
    assert r.status_code == 400 and "a number counts its digits" in r.json()["detail"]
    for source, trials, bad, message in lab:
        variants = "exact" if bad == "variants" else ["exact"]
        round_number = math.nan if bad == "round" else 1
        stream = raw_call(demo, "lab", [source, round_number, trials, variants])
        assert "event: error" in stream and re.search(message, stream), stream
    for n, message in [(None, "samples is missing"), (math.nan, "samples must be a whole number"),
                       (10**30, r"samples must be in 10\.\.200"), ([10], "whole number, got list")]:
        stream = raw_call(demo, "e2e", [n, *args(temperature=1.0)])
        assert "event: error" in stream and re.search(message, stream), stream
    assert c.predict(*args(max_new_tokens=4), api_name="/run")[0].startswith("Done")


def page_request(session: str) -> SimpleNamespace:
    """The gr.Request of a page on this machine with the given session."""
    return SimpleNamespace(client=SimpleNamespace(host="127.0.0.1"), headers={}, session_hash=session)


def call_hidden(demo, name: str, values: list, session: str) -> str:
    """Call an event that has no API name (api_name=False) by its index, as anyone can, and
    return its messages up to the one that completes it."""
    import httpx

    api = demo.url + "gradio_api"
    fn_index = next(i for i, fn in demo.fns.items() if fn.name == name)
    body = json.dumps({"data": values, "fn_index": fn_index, "session_hash": session,
                       "event_data": None, "trigger_id": None})
    httpx.post(f"{api}/queue/join", content=body, headers={"content-type": "application/json"},
               timeout=30).raise_for_status()
    lines = []
    with httpx.stream("GET", f"{api}/queue/data?session_hash={session}", timeout=60) as stream:
        for line in stream.iter_lines():
            lines.append(line)
            if "process_completed" in line:
                break
    return "\n".join(lines)


def test_events_without_an_api_name_coerce_their_arguments_too(demo):
    for i, (field, value, message) in enumerate([("k", math.nan, "k must be a whole number"),
                                                 ("prompt", ["a"], "prompt must be text"),
                                                 ("seed", 10**30, "seed must be in")]):
        text = call_hidden(demo, "rerun_float32", [None, *args(**{field: value})], f"hidden-{i}")
        assert '"success":false' in text.replace(" ", "") and re.search(message, text), text


def test_the_end_to_end_check_refuses_temperature_0_before_the_line_and_a_load(demo, monkeypatch):
    """At temperature 0 the refusal came from inside the job: after a place in line, and a switch
    to the page's pair or dtype (the panel said "Loading the pair…" until then)."""
    import gradio as gr

    e2e = handler(demo, "e2e_run")
    monkeypatch.setattr(demo.specviz.store, "loading", lambda *a: pytest.fail("loaded"))
    shown = []
    with pytest.raises(gr.Error, match="set a temperature above 0"):
        for out in e2e(None, 10, *args(temperature=0.0, dtype="bfloat16")):
            shown.append(out)
    assert shown == ["<div class='specviz-lab'>⚠ set a temperature above 0 (Run tab, Sampling; the check "
                     "samples with the Run tab&#x27;s settings): at 0 every sample is the same</div>"]


def test_a_link_that_cannot_be_made_clears_the_box(demo):
    """The box (and the clipboard) kept the last link, of settings the page no longer had."""
    import gradio as gr

    share = handler(demo, "share_query")
    made = RunSettings(**dict(zip(FIELDS, args(seed=3), strict=True)))
    assert list(share(*args(seed=3))) == [made.to_query()] and "seed=3" in made.to_query()
    shown = []
    with pytest.raises(gr.Error, match="cannot make a link: seed must be a whole number, got 2.5"):
        for out in share(*args(seed=2.5)):
            shown.append(out)
    assert shown == [""]


def test_the_float32_rerun_needs_a_run_first(demo):
    """A curious click before any run started a full float32 run (minutes on a CPU)."""
    text = call_hidden(demo, "rerun_float32", [None, *args()], "rerun-first")
    assert '"success":false' in text.replace(" ", "") and "run first: this button runs the page" in text


def test_the_tree_playback_coerces_its_round_and_needs_a_run(demo):
    for i, (round_number, key, message) in enumerate([
            (math.nan, None, "round must be a whole number"), ([1], None, "whole number, got list"),
            (10**30, None, r"round must be in 1\.\.1000000"), (1, "trace-forged", "no run yet"),
            (1, {"key": 1}, "no run yet")]):
        text = call_hidden(demo, "play_tree", [round_number, key], f"playback-{i}")
        assert '"success":false' in text.replace(" ", "") and re.search(message, text), text


def test_an_idle_servers_queue_wakes_a_few_times_a_second_not_hundreds(demo):
    """Gradio's queue looked for waiting events every millisecond and for progress to send every
    10 ms, however long nobody used the app: 7-8% of a Space's core idle, 800 wake-ups a second.
    The served app's queue wakes at most 30 times a second idle, while an event waits at most
    50 ms more to start and progress is still sent at least 10 times a second."""
    queue = demo._queue  # as launched
    assert 1 / queue.sleep_when_free + 1 / queue.progress_update_sleep_when_free <= 30
    assert queue.sleep_when_free <= 0.05 and queue.progress_update_sleep_when_free <= 0.1


def test_the_stops_step_through_the_queue_plots_the_pages_rounds_once_and_clears_them(demo):
    """The Run tab's Stop sends its step (caught_up) through the queue, as anyone can by its index:
    it reads the page's `sides` on the server (whatever the caller sends), answers every plot of
    those rounds and clears `sides` in the page's state; a second step has nothing to plot and
    completes all the same (an answer Gradio refused, its outputs not matching, left the plots
    older than the headline and an "Error" under the Stop)."""
    from specviz.metrics import RunStats
    from specviz.service import Sides

    run = next(fn for fn in demo.fns.values() if fn.name == "run")
    sides, last = run.outputs[-2], run.outputs[-1]
    shown = list(handler(demo, "run")(page_request("stop-step-run"), None, *args(max_new_tokens=6)))
    key = shown[-1][run.outputs.index(last)]
    trace = demo.specviz.shelf.get(key)
    page = demo.state_holder["stop-step"]
    page[sides._id] = Sides(RunStats(trace.stats.events), None, 3)
    try:
        text = call_hidden(demo, "caught_up", [None], "stop-step")
        completed = text.replace(" ", "").splitlines()[-1]
        assert '"success":true' in completed and "Tokens per target pass" in text, text
        assert "Tokens against wall-clock time" in text
        assert page.state_data[sides._id] is None
        again = call_hidden(demo, "caught_up", ["forged"], "stop-step").replace(" ", "").splitlines()[-1]
        assert '"success":true' in again and "Tokens per target pass" not in again, again
    finally:
        demo.specviz.shelf.drop(key)


def test_the_dockerfiles_health_check_passes_while_the_app_serves_and_fails_where_nothing_listens(demo):
    """docker ps and an orchestrator read a container's health from the Dockerfile's HEALTHCHECK:
    without one, a server that had stopped answering still read as up. Its command, run as Docker
    runs it (the container's GRADIO_SERVER_PORT), passes against the served app and fails within
    its timeout where nothing listens."""
    import subprocess
    import sys
    from urllib.parse import urlparse

    from test_app import free_port
    from test_deploy import dockerfile

    check = [args for op, args in dockerfile() if op == "HEALTHCHECK"]
    assert len(check) == 1 and " CMD " in check[0]
    command = json.loads(check[0].split(" CMD ", 1)[1])
    assert command[0] == "python"
    for port, passes in ((urlparse(demo.url).port, True), (free_port(), False)):
        env = dict(os.environ, GRADIO_SERVER_PORT=str(port))
        done = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
        assert (done.returncode == 0) is passes, done.stderr.decode()[-300:]


def test_the_auto_run_event_reads_run_from_the_servers_state_not_from_the_caller(demo):
    gate = demo.specviz.gate
    text = call_hidden(demo, "auto_run", [True, *args(k=math.nan)], "auto-run-caller")
    completed = text.replace(" ", "").splitlines()[-1]  # the messages before it say "success":true anyway
    assert '"process_completed"' in completed and '"success":true' in completed
    assert "Done" not in text and len(gate) == 0


def test_a_fourteen_thousand_token_prompt_is_refused_with_the_fix(demo):
    from gradio_client.exceptions import AppError

    prompt = "東京🙂" * 1300  # 3,900 characters, each 3-4 bytes: ~14,000 byte-level tokens
    with pytest.raises(AppError, match=r"the prompt is 1\d{4} tokens; this deployment allows 2048 "
                                       r"\(operators: SPECVIZ_MAX_PROMPT_TOKENS\): shorten it"):
        client(demo).predict(*args(prompt=prompt), api_name="/run")


def test_the_prompt_box_holds_every_prompt_the_server_takes_and_a_longer_one_is_refused_with_the_fix(demo):
    """The prompt box's maxlength counts UTF-16 units (an emoji is two), the server characters: a
    box of max_prompt_chars cut 4,000 emoji, which the server takes, to 2,000, silently, and cut
    any longer paste silently too. The box holds twice as many units, and what fills it is within
    the queue's text cap, so the server answers it with its own message naming the fix."""
    from gradio_client.exceptions import AppError

    box = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "prompt")
    chars = demo.specviz.limits.max_prompt_chars
    assert len(("🙂" * chars).encode("utf-16-le")) // 2 <= box.max_length
    with pytest.raises(AppError, match=rf"prompt has {box.max_length} characters; this deployment "
                                       rf"allows {chars}: shorten it"):
        client(demo).predict(*args(prompt="a" * box.max_length), api_name="/run")


def test_end_to_end_sampling_over_the_cap_is_refused(demo):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=r"samples must be in 10\.\.200"):
        client(demo).predict(2000, *args(temperature=1.0), api_name="/e2e")
    result = client(demo).predict(10, *args(temperature=1.0, k=2), api_name="/e2e")
    assert "10 samples each of 3 tokens (round 1 drafts all 2)" in result


def test_stop_cancels_the_end_to_end_check_and_frees_the_model(demo, monkeypatch):
    import app

    # the check's 400 samples took half a second: a fast machine could finish them before the
    # client's cancel landed (40 s now, past the wait below for the model: a cancel that stops
    # nothing is seen)
    slowed(monkeypatch, app, "continuations", 0.1)
    gate = demo.specviz.gate
    assert wait_until(lambda: len(gate) == 0)
    c = client(demo)
    job = c.submit(200, *args(temperature=1.0, k=2, max_new_tokens=8), api_name="/e2e")
    assert wait_until(lambda: any("Sampling: " in str(o) for o in job.outputs()), 60)
    job.cancel()
    assert wait_until(lambda: len(gate) == 0), "the cancelled check kept the model"
    assert not any("samples each of 3 tokens" in str(o) for o in job.outputs())


# --- fairness: the gate ----------------------------------------------------------------------


def test_the_gate_lets_jobs_through_one_at_a_time_in_arrival_order():
    gate, order = Gate(), []
    first = gate.ticket("a")
    waiting = [gate.ticket(s) for s in ("b", "c", "d")]
    assert [gate.ahead(t) for t in waiting] == [1, 2, 3]

    def job(ticket):
        for _ in ticket.waiting(poll=0.05):
            pass
        order.append(ticket.session)
        time.sleep(0.02)
        ticket.release()

    threads = [threading.Thread(target=job, args=(t,)) for t in reversed(waiting)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert order == []  # "a" still holds the model
    first.release()
    for t in threads:
        t.join(5)
    assert order == ["b", "c", "d"] and len(gate) == 0


def test_a_released_model_wakes_the_next_job_at_once_not_at_its_next_poll():
    """A waiter polling once a minute gets the model when the job ahead releases it, not up to a
    minute later (the model idle meanwhile)."""
    gate = Gate()
    first, second = gate.ticket("a"), gate.ticket("b")
    started = threading.Event()

    def job():
        for _ in second.waiting(poll=60.0):
            started.set()
        second.release()

    waiter = threading.Thread(target=job, daemon=True)
    waiter.start()
    assert started.wait(5)  # it has answered "1 ahead" and now waits up to a minute
    first.release()
    waiter.join(20)
    assert not waiter.is_alive() and len(gate) == 0


def test_a_second_job_from_the_same_session_is_refused_at_once():
    gate = Gate()
    with gate.ticket("visitor"):
        with pytest.raises(Busy, match="busy: you already have a job waiting or running; wait for it, or "
                                       "press the Run tab's Stop"):
            gate.ticket("visitor")
        gate.ticket("someone else").release()
    gate.ticket("visitor").release()  # free again once the first job ended


def test_sessions_a_client_makes_up_do_not_buy_more_places_than_its_address_allows():
    """The session is the client's to choose: calls without one share a place, and one public
    address holds at most per_address places. Private addresses (a proxy's) are not counted."""
    gate = Gate(per_address=2)
    api = gate.ticket(None)
    with pytest.raises(Busy, match="a call without a session is already waiting"):
        gate.ticket(None, "8.8.8.8")
    api.release()
    held = [gate.ticket(f"made-up-{i}", "8.8.8.8") for i in range(2)]
    with pytest.raises(Busy, match="2 jobs from your address"):
        gate.ticket("made-up-2", "8.8.8.8")
    gate.ticket("another visitor", "1.1.1.1").release()
    for same in ("::ffff:8.8.8.8", "::FFFF:8.8.8.8"):  # the same client, seen through IPv6
        with pytest.raises(Busy, match="from your address"):
            gate.ticket("made-up-v6", same)
    v6 = [gate.ticket(f"v6-{i}", f"2a00:1450:4001:8{i}0::1") for i in range(2)]  # two /64s ...
    with pytest.raises(Busy, match="from your address"):  # ... of one /56: one subscriber
        gate.ticket("v6-2", "2a00:1450:4001:8ff:ffff::1%eth0")
    gate.ticket("v6-other", "2a00:1450:4001:900::1").release()
    for t in v6:
        t.release()
    shared = ["10.16.3.80", "10.16.3.80", "10.16.3.80", "127.0.0.1", "not an address", None]
    behind_proxy = [gate.ticket(f"visitor-{i}", address) for i, address in enumerate(shared)]
    held.pop().release()
    gate.ticket("made-up-3", "8.8.8.8").release()  # a place freed: the address may queue again
    for t in held + behind_proxy:
        t.release()
    assert len(gate) == 0


def test_one_ipv6_48_cannot_fill_the_line_with_its_256_56s():
    """A tunnel broker's free /48 is 256 /56s, each counted as a client: it holds a quarter of the
    line, and a visitor from elsewhere still gets a place."""
    gate = Gate(max_jobs=16, per_address=2)
    held = [gate.ticket(f"s{i}", f"2001:470:abcd:{i // 2:02x}00::{i % 2 + 1}") for i in range(4)]
    with pytest.raises(Busy, match=r"4 jobs from your network \(2001:470:abcd::/48\)"):
        gate.ticket("s4", "2001:470:abcd:0700::1")
    others = [gate.ticket("v4", "8.8.8.8"), gate.ticket("v6", "2001:470:abce::1")]  # another /48
    held.pop().release()
    gate.ticket("s5", "2001:470:abcd:0700::1").release()  # a place freed: the /48 may queue again
    for t in held + others:
        t.release()
    assert len(gate) == 0 and gate.per_network == 4 and Gate(max_jobs=4, per_address=2).per_network == 2


def test_a_full_line_refuses_new_jobs_and_a_silent_waiter_loses_its_place():
    gate = Gate(max_jobs=2, stale_after=0.2)
    head, silent = gate.ticket("a"), gate.ticket("b")
    with pytest.raises(Busy, match="2 jobs are already running or waiting"):
        gate.ticket("c")
    time.sleep(0.3)
    head.touch()  # the holder is alive; "b" never polled
    late = gate.ticket("c")
    assert len(gate) == 2 and gate.ahead(late) == 1 and silent not in gate._line
    with pytest.raises(Busy, match="lost"):
        next(silent.waiting(poll=0.01))


def test_closing_a_waiting_job_gives_its_place_back():
    gate = Gate()
    head = gate.ticket("a")

    def handler():
        with gate.ticket("b") as ticket:
            yield from ticket.waiting(poll=0.05)

    waiting = handler()
    assert next(waiting) == 1 and len(gate) == 2
    waiting.close()  # what Gradio does on Stop / cancel
    assert len(gate) == 1
    head.release()


def test_over_the_app_a_second_job_is_busy_a_waiting_job_sees_its_place_and_stop_frees_it(demo):
    from gradio_client.exceptions import AppError

    gate = demo.specviz.gate
    assert wait_until(lambda: len(gate) == 0)
    holder = gate.ticket("another visitor")  # someone else's job holds the model
    try:
        c = client(demo)
        job = c.submit(*args(), api_name="/run")
        assert wait_until(lambda: len(job.outputs()) > 0)
        assert job.outputs()[0][0].startswith("waiting for the model: 1 ahead of you")
        started = time.monotonic()
        with pytest.raises(AppError, match="busy: you already have a job waiting or running"):
            c.predict(*args(), api_name="/run")
        assert time.monotonic() - started < 5  # answered at once, not after the wait
        with pytest.raises(AppError, match="busy"):
            c.predict("example", 1, 2000, ["exact"], api_name="/lab")
        job.cancel()  # Stop while waiting
        assert wait_until(lambda: len(gate) == 1), "the cancelled job kept its place in line"
    finally:
        holder.release()
    assert wait_until(lambda: len(gate) == 0)
    assert client(demo).predict(*args(max_new_tokens=4), api_name="/run")[0].startswith("Done")


@pytest.mark.parametrize("leave_while", ["waiting", "running"])
def test_a_visitor_who_leaves_while_waiting_or_running_frees_the_model(demo, leave_while, monkeypatch):
    import httpx

    slow_rounds(monkeypatch, 0.1)  # 200 rounds: 20 s, so that the run is under way when its visitor
    # leaves (the tiny pair's could end first, and the test then checked nothing)
    gate, api = demo.specviz.gate, demo.url + "gradio_api"
    assert wait_until(lambda: len(gate) == 0)
    holder = gate.ticket("another visitor") if leave_while == "waiting" else None
    fn_index = next(i for i, fn in demo.fns.items() if fn.name == "run")
    session = f"leaver-{leave_while}"
    values = args(proposer="none", k=1, max_new_tokens=200)
    httpx.post(f"{api}/queue/join", json={"data": values, "fn_index": fn_index, "session_hash": session,
                                          "event_data": None, "trigger_id": None}).raise_for_status()
    sign = "waiting for the model" if leave_while == "waiting" else "Speculative run: round"
    with httpx.stream("GET", f"{api}/queue/data?session_hash={session}", timeout=60) as stream:
        for line in stream.iter_lines():
            if sign in line:
                break  # the tab closes: the connection drops
        assert any(t.session == session for t in gate._line)  # its job holds a place as it leaves
    try:
        assert wait_until(lambda: all(t.session != session for t in gate._line), 10)
    finally:
        if holder:
            holder.release()
    assert wait_until(lambda: len(gate) == 0)


def test_a_page_load_without_run_takes_no_model_slot(demo):
    loads = [fn for fn in demo.fns.values() if any(t[1] == "load" for t in fn.targets)]
    assert loads and all(fn.concurrency_id != "model" for fn in loads)
    model = [fn for fn in demo.fns.values() if fn.concurrency_id == "model"]
    assert {fn.name for fn in model} == {"run", "auto_run", "rerun_float32", "lab_run", "e2e_run"}
    auto = next(fn for fn in model if fn.name == "auto_run")
    assert [t[1] for t in auto.targets] == ["change"]  # the autorun State: only run=1 sets it
    stop = next(fn for fn in demo.fns.values() if fn.cancels)
    assert set(stop.cancels) == {fn._id for fn in model}


def test_a_page_load_lists_the_pairs_as_they_stand_now(demo, monkeypatch):
    """The menu's "unavailable" labels were computed once, when the page was built: a model cached
    later, or a hub gone quiet, read as at start-up until the server restarted."""
    load = handler(demo, "on_load")
    request = SimpleNamespace(query_params={})
    monkeypatch.setattr(presets, "availability", lambda preset, allow_large=None: "gone for the test")
    menu = load(request)[0]
    labels = [label for label, _ in menu["choices"]]
    assert menu["value"] == "tiny" and all(label.endswith("unavailable: gone for the test")
                                           for label in labels if "(command line)" not in label)
    monkeypatch.setattr(presets, "availability", lambda preset, allow_large=None: None)
    assert not any("unavailable" in label for label, _ in load(request)[0]["choices"])


def test_the_float32_rerun_checks_float32_before_it_queues(model_dirs, monkeypatch):
    """The float32 button on a 7-8B pair that fits only in bfloat16 is refused at once, by the
    dtype's message, not after the line and a load."""
    import gradio as gr

    import app
    from specviz.store import ModelStore

    monkeypatch.delenv("SPECVIZ_ALLOW_LARGE_MODELS", raising=False)
    monkeypatch.setattr(presets, "_memory_gib", lambda: (64.0, 0.0))  # room in bfloat16 only
    monkeypatch.setattr(presets, "is_cached", lambda model: True)
    built = app.build(ModelStore(device="cpu"), Limits(allow_large=None), RunSettings(pair="gpt2"))
    rerun = handler(built, "rerun_float32")
    values = args(pair="qwen2.5-7b", dtype="bfloat16")
    with pytest.raises(gr.Error, match="qwen2.5-7b in float32 needs twice the memory"):
        list(rerun(SimpleNamespace(query_params={}), None, None, *values))


def test_the_float32_rerun_after_a_float32_run_is_refused_with_the_way_to_run_in_float32(demo):
    """After a float32 run the button ran the same float32 run again: minutes for nothing."""
    import gradio as gr

    rerun = handler(demo, "rerun_float32")
    key = demo.specviz.shelf.put("rerun-again", SimpleNamespace(models={"dtype": "float32"}), nbytes=1)
    with pytest.raises(gr.Error, match="the last run was in float32 already: .* pick float32 under "
                                       "dtype and press Run"):
        list(rerun(SimpleNamespace(query_params={}), None, key, *args(dtype="bfloat16")))
    demo.specviz.shelf.drop(key)
    # a sampled run has no near-tie to check: the button ran a whole float32 run for nothing
    key = demo.specviz.shelf.put("rerun-sampled", SimpleNamespace(models={"dtype": "bfloat16"}), nbytes=1)
    with pytest.raises(gr.Error, match="checks a greedy run's near-tie, and these settings sample"):
        list(rerun(SimpleNamespace(query_params={}), None, key, *args(temperature=0.8)))
    demo.specviz.shelf.drop(key)


# --- links, messages and traces ---------------------------------------------------------------


def test_a_link_with_html_or_markdown_gives_an_escaped_clipped_notice():
    import app

    params = {"<img src=x>": "1", "k": "![x](http://evil.example/a.png)" + "y" * 80,
              "x" * 100: "1"}
    _, notices, _ = from_query(params, RunSettings(), Limits(), presets.BY_KEY)
    text = app.link_notice(notices)
    assert "<img" not in text and "&lt;img src\\=x&gt;" in text
    assert "![" not in text and "](" not in text and "\\!\\[x\\]\\(http" in text
    assert "y" * 40 not in text and "x" * 40 not in text  # clipped to 40 characters
    assert markdown_text("a_b*c") == "a\\_b\\*c"


def test_large_presets_are_refused_on_a_small_machine_in_settings_links_and_the_list(monkeypatch):
    monkeypatch.delenv("SPECVIZ_ALLOW_LARGE_MODELS", raising=False)
    monkeypatch.setattr(presets, "_memory_gib", lambda: (23.5, 0.0))  # this machine's
    small = Limits(allow_large=None)  # the operator left it to the machine
    s = RunSettings(pair="llama-3.1-8b")
    assert "SPECVIZ_ALLOW_LARGE_MODELS=1" in s.problems(small, presets.BY_KEY)["pair"]
    # allowed, it is refused here only because it is not cached and the hub is unreachable
    assert "too large" not in s.problems(Limits(allow_large=True), presets.BY_KEY).get("pair", "")
    back, notices, _ = from_query({"pair": "qwen2.5-7b"}, RunSettings(), small, presets.BY_KEY)
    assert back.pair == RunSettings().pair and "too large" in notices[0]
    listed = dict((p.key, why) for p, why in presets.listing(allow_large=None))
    assert all("too large" in listed[k] for k in ("qwen2.5-7b", "llama-3.1-8b", "pythia-6.9b"))
    assert not any("too large" in (listed[k] or "") for k in ("gpt2", "smollm2-1.7b"))


def test_a_large_preset_in_float32_needs_twice_the_memory(monkeypatch):
    """A 7-8B pair holds 16-19 GB of weights in bfloat16 and 32-37 GB in float32: a 64 GiB machine
    has room for the first (48 GiB needed) and not the second (96). A refusal for float32 alone
    is the dtype's, so a link that asks for it keeps its pair and drops the dtype."""
    monkeypatch.delenv("SPECVIZ_ALLOW_LARGE_MODELS", raising=False)
    monkeypatch.setattr(presets, "_memory_gib", lambda: (64.0, 0.0))
    monkeypatch.setattr(presets, "is_cached", lambda model: True)  # else: not cached, no hub
    limits = Limits(allow_large=None)  # unset by the operator: the machine decides
    for dtype in ("auto", "bfloat16"):
        assert RunSettings(pair="qwen2.5-7b", dtype=dtype).problems(limits, presets.BY_KEY) == {}, dtype
    problems = RunSettings(pair="qwen2.5-7b", dtype="float32").problems(limits, presets.BY_KEY)
    assert set(problems) == {"dtype"}
    assert problems["dtype"] == (
        "qwen2.5-7b in float32 needs twice the memory (too large for this machine, 64 GiB RAM and no "
        "CUDA GPU, where a 7-8B pair needs 96 GiB RAM or a 48 GB GPU in float32; operators: "
        "SPECVIZ_ALLOW_LARGE_MODELS=1 offers them): pick bfloat16 or auto")
    base = RunSettings(pair="qwen2.5-7b", dtype="bfloat16")
    back, notices, _ = from_query({"dtype": "float32"}, base, limits, presets.BY_KEY)
    assert back == base and notices[0].startswith("ignored link parameter dtype: qwen2.5-7b in float32")
    assert RunSettings(pair="gpt2", dtype="float32").problems(limits, presets.BY_KEY) == {}  # not large
    on = Limits(allow_large=True)  # the operator's switch overrides the machine
    assert RunSettings(pair="qwen2.5-7b", dtype="float32").problems(on, presets.BY_KEY) == {}
    # a card sold as 24 GB reports less than 24 GiB (an A10G 22.5): room in bfloat16 only
    monkeypatch.setattr(presets, "_memory_gib", lambda: (16.0, 22.5))
    assert RunSettings(pair="qwen2.5-7b").problems(limits, presets.BY_KEY) == {}
    why = RunSettings(pair="qwen2.5-7b", dtype="float32").problems(limits, presets.BY_KEY)["dtype"]
    assert "16 GiB RAM and a 22 GiB GPU, where a 7-8B pair needs 96 GiB RAM or a 48 GB GPU in float32" in why
    monkeypatch.setattr(presets, "_memory_gib", lambda: (16.0, 21.0))  # under 90% of 24: too small
    assert "too large for this machine, 16 GiB RAM and a 21 GiB GPU, where a 7-8B pair needs 48 GiB " \
        "RAM or a 24 GB GPU;" in RunSettings(pair="qwen2.5-7b").problems(limits, presets.BY_KEY)["pair"]
    monkeypatch.setattr(presets, "_memory_gib", lambda: (512.0, 141.0))
    assert "7-8B pairs are off on this deployment" in RunSettings(pair="qwen2.5-7b").problems(
        Limits(allow_large=False), presets.BY_KEY)["pair"]  # the operator's 0: not a size


def test_messages_show_no_server_paths_and_no_html():
    import app
    from specviz.service import public_message

    msg = public_message("cannot load model '/home/alice/models/secret-7b': missing ~/.cache/x/config.json")
    assert msg == "cannot load model '…/secret-7b': missing …/config.json"
    assert public_message("Qwen/Qwen2.5-7B-Instruct at 3.2 tokens/s, p/q") == \
        "Qwen/Qwen2.5-7B-Instruct at 3.2 tokens/s, p/q"
    # an opened trace's names were shortened when it was saved: "……/target" said them twice
    assert public_message("Replay of a saved run: …/target with …/draft") \
        == "Replay of a saved run: …/target with …/draft"
    assert public_message("…/srv/app/x") == "……/x"  # a longer path after one is still cut
    error = app.user_error(ValueError("unknown pair '<img src=x onerror=alert(1)>' in /srv/app/x"))
    assert "<img" not in error.message and "/srv" not in error.message and "&lt;img" in error.message


def make_trace(demo, models=None, **over):
    """A real run's trace from the app's own store, optionally claiming other models."""
    from specviz.service import run_views

    s = RunSettings(**(dict(pair="tiny", chat=False, max_new_tokens=8, prompt="def f", dtype="float32",
                            k=3) | over))
    trace = list(run_views(demo.specviz.store, s, demo.specviz.limits))[-1].trace
    return replace(trace, models=trace.models | (models or {}))


def test_a_tree_trace_with_hostile_token_text_is_escaped_and_not_replayed_in_the_explorer(demo):
    from specviz.service import explorer_refusal, replay_view, tree_round

    xss = "<img src=x onerror=alert(1)>"
    trace = make_trace(demo, proposer="tree", nodes=6, branching=2)
    trace = replace(trace, spans=tuple(replace(span, text=xss) for span in trace.spans),
                    models=trace.models | {"target": "someone/else"})  # not the loaded pair: span text
    view = replay_view(trace)
    assert view.is_tree and view.tree_html.count('class="tok ') >= 2
    for text in (view.tree_html, view.tree_overview, *tree_round(trace, 1, demo.specviz.store.current())):
        assert "<img" not in text and "&lt;img" in text
    assert "not replayed at other depths" in explorer_refusal(trace)


def test_replaying_a_trace_escapes_and_clips_its_model_names(demo):
    from specviz.service import replay_view

    trace = make_trace(demo, {"target": "<img src=x>![t](http://e/x.png)" + "z" * 200,
                              "draft": "/home/bob/secret/draft"})
    status = replay_view(trace).status
    assert "<img" not in status and "![" not in status and "z" * 60 not in status
    assert "/home" not in status and "secret" not in status


def test_the_lab_refuses_a_round_from_a_trace_of_another_pair(demo, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    c = client(demo)
    good = tmp_path / "good.json"
    good.write_text(make_trace(demo).to_json())
    c.predict(handle_file(str(good)), api_name="/open_trace")
    info = c.predict("round", 1, 2000, ["exact"], api_name="/lab")[0]
    assert "round 1, draft position 1" in info
    other = tmp_path / "other.json"
    other.write_text(make_trace(demo, {"target": "someone/else-7b"}).to_json())
    opened = c.predict(handle_file(str(other)), api_name="/open_trace")
    assert opened[-1].startswith("Opened: Replay of a saved run: someone\\/else\\-7b")
    with pytest.raises(AppError, match=r"this trace was made with someone/else-7b with .*: run it here "
                                       r"first") as e:
        c.predict("round", 1, 2000, ["exact"], api_name="/lab")
    assert "/tmp" not in str(e.value)  # the loaded pair's folders are not shown


def test_the_lab_bounds_a_rounds_prefix_and_checks_its_ids(demo):
    from specviz import labview

    store, limits = demo.specviz.store, demo.specviz.limits
    trace = make_trace(demo)
    pair = store.current()
    with pytest.raises(ValueError, match="outside the loaded pair's vocabulary"):
        finished(labview.from_round_steps(pair, replace(trace, prompt_ids=[pair.vocab_size + 5]), 1))
    long = replace(trace, prompt_ids=[1] * 300)
    with pytest.raises(ValueError, match="starts after 300 tokens; the lab reads at most 256"):
        finished(labview.from_round_steps(pair, long, 1,
                                          max_tokens=limits.max_prompt_tokens + limits.max_new_tokens))
    with pytest.raises(ValueError, match="prompt is 300 tokens; this deployment allows 100"):
        finished(labview.from_round_steps(pair, long, 1, max_prompt_tokens=100))
    with pytest.raises(ValueError, match="temperature"):
        finished(labview.from_round_steps(pair, replace(trace, settings={"temperature": float("nan")}), 1))


def test_an_uploaded_trace_leaves_memory_when_its_session_ends(demo, tmp_path):
    from gradio_client import handle_file

    shelf = demo.specviz.shelf
    path = tmp_path / "t.json"
    path.write_text(make_trace(demo).to_json())
    c = client(demo)
    c.predict(handle_file(str(path)), api_name="/open_trace")
    c.predict(handle_file(str(path)), api_name="/open_trace")  # a session keeps only its newest
    mine = [k for k, held in shelf._items.items() if held.session == c.session_hash]
    assert len(mine) == 1
    unload = next(fn for fn in demo.fns.values() if any(t[1] == "unload" for t in fn.targets))
    unload.fn(SimpleNamespace(session_hash=c.session_hash))  # what a closed tab (or a blip) triggers
    assert shelf.get(mine[0]) is not None  # a page whose connection dropped may still be open
    from specviz.hooks import forget_pages

    demo.state_holder.session_data[c.session_hash].is_closed = True  # what Gradio marks then
    assert forget_pages(demo.state_holder, idle=3600, closed=0) >= 1  # hooks.Tidy: closed, unused
    assert shelf.get(mine[0]) is None
    state = next(b for b in demo.blocks.values() if type(b).__name__ == "State"
                 and getattr(b, "delete_callback", None) == shelf.drop)  # Gradio's expiry frees the shelf too
    assert state.time_to_live == math.inf  # expired with its page (hooks.Tidy), not an hour after its run


def test_a_saved_trace_names_a_local_model_folder_by_its_last_part_only(demo):
    trace = make_trace(demo)
    assert trace.models["target"] == "…/target" and trace.models["draft"].startswith("…/draft")
    assert "/tmp" not in trace.to_json()


def test_uploads_and_downloads_are_cleaned_from_the_cache(demo):
    import app

    frequency, age = demo.delete_cache
    assert demo.delete_cache == app.CLEAN_CACHE and frequency <= 600 and age <= 3600


def test_the_shelf_holds_a_bounded_number_of_bytes():
    from specviz.gate import Shelf

    shelf, trace = Shelf(max_bytes=1000), SimpleNamespace()
    keys = [shelf.put(f"s{i}", trace, nbytes=300) for i in range(10)]
    assert shelf.nbytes <= 1000 and len(shelf) == 3 and shelf.get(keys[-1]) is trace
    assert shelf.get(keys[0]) is None and shelf.get(None) is None and shelf.get(["x"]) is None


def test_one_client_cannot_push_everyone_elses_traces_off_the_shelf():
    """Twenty uploads, each under a made-up session or none, from one public address: the shelf
    keeps that address's newest two and one session-less trace, and every visitor's own."""
    from specviz.gate import Shelf

    shelf, trace = Shelf(max_bytes=1000, per_address=2), SimpleNamespace()
    visitors = [shelf.put(f"visitor-{i}", trace, nbytes=100, address=f"1.1.1.{i}") for i in range(5)]
    made_up = [shelf.put(f"made-up-{i}", trace, nbytes=100, address="8.8.8.8") for i in range(20)]
    sessionless = [shelf.put(None, trace, nbytes=100, address="9.9.9.9") for _ in range(20)]
    assert all(shelf.get(k) is trace for k in visitors + made_up[-2:] + sessionless[-1:])
    assert len(shelf) == 5 + 2 + 1 and shelf.nbytes == 800
    # the pages whose trace was let go are told so (among the last LET_GO_KEPT), no other key
    assert all(shelf.let_go(k) for k in made_up[:-2])  # not a session's own replaced: sessionless
    assert not any(shelf.let_go(k) for k in [*visitors, *made_up[-2:], "trace-forged", None, ["x"]])
    # behind a proxy (a private address) only the byte cap holds, as before
    [shelf.put(f"p{i}", trace, nbytes=100, address="10.0.0.1") for i in range(5)]
    assert shelf.nbytes <= 1000


def test_a_page_whose_run_the_shelf_let_go_is_told_so(demo, monkeypatch):
    """Visitors behind one address share its runs: a third page's run let the first page's go,
    and Save said "no run to save yet: run something first" under that run."""
    import gradio as gr

    from specviz import gate

    shelf, fns = demo.specviz.shelf, {fn.name: fn.fn for fn in reversed(demo.fns.values())}
    run = SimpleNamespace(models={"dtype": "bfloat16"}, settings={})
    keys = [shelf.put(f"shared-{i}", run, nbytes=1, address="8.8.4.4") for i in range(shelf.per_address + 1)]
    let_go = (r"no longer holds this page's last run \(it keeps the newest 2 runs or opened traces of "
              "each address")
    with pytest.raises(gr.Error, match=let_go):
        fns["save"](keys[0])
    with pytest.raises(gr.Error, match=let_go):
        list(fns["lab_run"]("round", 1, 1000, ["exact"], keys[0], None))
    with pytest.raises(gr.Error, match=let_go):
        fns["play_tree"](1, keys[0])
    with pytest.raises(gr.Error, match=let_go):
        list(fns["rerun_float32"](SimpleNamespace(query_params={}), None, keys[0], *args()))
    assert re.search(let_go, fns["explore"](4, False, "", keys[0])[0])
    with pytest.raises(gr.Error, match="no run to save yet: run something first"):
        fns["save"]("trace-never-made")
    with pytest.raises(gr.Error, match="the page's settings changed since the last run"):
        list(fns["rerun_float32"](SimpleNamespace(query_params={}), None, keys[-1], *args()))
    monkeypatch.setattr(gate, "LET_GO_KEPT", 3)  # the keys it remembers are bounded
    [shelf.put(f"shared-again-{i}", run, nbytes=1, address="8.8.4.4") for i in range(5)]
    assert len(shelf._let_go) == 3 and not shelf.let_go(keys[0])
    for key in keys:
        shelf.drop(key)


def test_a_page_whose_state_went_with_its_run_is_told_so(demo, monkeypatch):
    """A page whose state the server let go (hooks.Tidy: without a connection and unused past the
    grace, as after a laptop's sleep) still shows its run, and every button that reads the run
    said "run something first"; now they say the server let the page go. A page that never ran
    is still told to run first, and the sessions remembered are bounded."""
    import gradio as gr

    from specviz import gate

    shelf, fns = demo.specviz.shelf, {fn.name: fn.fn for fn in reversed(demo.fns.values())}
    run = SimpleNamespace(models={"dtype": "bfloat16"}, settings={})
    asleep, fresh = page_request("asleep"), page_request("never-ran")
    shelf.drop(shelf.put("asleep", run, nbytes=1))  # the State's delete callback, as Tidy runs it
    gone = r"no longer holds this page's state or its last run \(it lets a page go some time after"
    with pytest.raises(gr.Error, match=gone):
        fns["save"](None, asleep)
    with pytest.raises(gr.Error, match=gone):
        list(fns["lab_run"]("round", 1, 1000, ["exact"], None, asleep))
    with pytest.raises(gr.Error, match=gone):
        fns["play_tree"](1, None, asleep)
    with pytest.raises(gr.Error, match=gone):
        list(fns["rerun_float32"](asleep, None, None, *args()))
    assert re.search(gone, fns["explore"](4, False, "", None, asleep)[0])
    with pytest.raises(gr.Error, match="no run to save yet: run something first"):
        fns["save"](None, fresh)
    with pytest.raises(gr.Error, match="no run to save yet: run something first"):
        fns["save"](None)  # no request: a direct call
    shelf.drop(shelf.put(None, run, nbytes=1))  # calls without a session share one place: no page
    assert not shelf.forgot(gate.NO_SESSION)
    # a page whose run the shelf let go (it was told so), then whose state went: still told why
    first = shelf.put("told", run, nbytes=1, address="9.9.9.9")
    [shelf.put(f"told-{i}", run, nbytes=1, address="9.9.9.9") for i in range(shelf.per_address)]
    assert shelf.let_go(first)
    shelf.drop(first)
    with pytest.raises(gr.Error, match=gone):
        fns["save"](None, page_request("told"))
    # a page whose state Gradio pushed out past its capacity (no delete callback) while its run
    # stayed on the shelf: the page's session finds it, and it is the run that is saved
    kept = make_trace(demo, max_new_tokens=4)
    key = shelf.put("pushed-out", kept)
    pushed = page_request("pushed-out")
    assert open(fns["save"](None, pushed)).read() == kept.to_json()
    assert "Measured run (k=3)" in fns["explore"](3, False, "", None, pushed)[0]
    shelf.drop(key)
    # a Stop during a run's last step: the run's trace replaced the page's older one on the shelf,
    # but Gradio dropped the step's outputs, so the page still holds the older run's key. Save,
    # the lab and the explorer said "run something first"; they now use the page's newest run
    older = shelf.put("stopped-late", run, nbytes=1)
    newer = make_trace(demo, max_new_tokens=4)
    shelf.put("stopped-late", newer)
    late = page_request("stopped-late")
    assert open(fns["save"](older, late)).read() == newer.to_json()
    assert "Measured run (k=3)" in fns["explore"](3, False, "", older, late)[0]
    with pytest.raises(gr.Error, match="no run to save yet: run something first"):
        fns["save"](older, fresh)  # another page's key names nothing of this one's
    monkeypatch.setattr(gate, "LET_GO_KEPT", 3)  # the sessions it remembers are bounded
    for i in range(5):
        shelf.drop(shelf.put(f"asleep-{i}", run, nbytes=1))
    assert len(shelf._forgotten) == 3 and not shelf.forgot("asleep") and shelf.forgot("asleep-4")


def test_a_flood_of_uploads_pushes_out_only_uploads():
    """Behind a proxy no address counts, and made-up sessions are free: 50 uploads from them
    once pushed every visitor's run off the shelf. Over the byte budget, uploads go first (least
    recently used), and a run only when no other upload is left."""
    from specviz.gate import Shelf

    shelf, trace = Shelf(max_bytes=1000), SimpleNamespace()
    runs = [shelf.put(f"visitor-{i}", trace, nbytes=100) for i in range(5)]
    opened = shelf.put("reader", trace, nbytes=100, uploaded=True)
    assert shelf.get(opened) is trace  # the reader looks at it: the most recently used upload
    flood = [shelf.put(f"made-up-{i}", trace, nbytes=100, uploaded=True) for i in range(50)]
    assert all(shelf.get(k) is trace for k in runs) and shelf.nbytes == 1000
    assert [shelf.get(k) is trace for k in flood] == [False] * 45 + [True] * 5
    assert shelf.get(opened) is None  # an upload too, older than the flood's newest five
    big = shelf.put("huge", trace, nbytes=800, uploaded=True)  # drops the five, then runs
    assert shelf.get(big) is trace and shelf.nbytes == 1000
    assert [shelf.get(k) is trace for k in runs] == [False, False, False, True, True]


def test_uploads_over_the_size_limit_are_refused(demo, tmp_path):
    from gradio_client import handle_file

    from specviz.trace import MAX_TRACE_BYTES

    big = tmp_path / "big.json"
    big.write_text(json.dumps({"format": "specviz-trace", "pad": "x" * (MAX_TRACE_BYTES + 10)}))
    with pytest.raises(Exception, match="(?i)size|large|413|exceed"):
        client(demo).predict(handle_file(str(big)), api_name="/open_trace")


def test_busy_is_a_value_error_with_the_fix(demo):
    """The fix names the Stop that ends any job of the page: the lab's own Stop leaves a run."""
    assert issubclass(Busy, ValueError) and "press the Run tab's Stop" in BUSY
    stops = [set(fn.cancels) for fn in demo.fns.values() if fn.cancels]
    every = {fn._id for fn in demo.fns.values() if fn.concurrency_id == "model"}
    assert len(stops) == 2 and every in stops and len(every) == 5, (stops, every)


def test_uploads_and_views_wait_in_lines_of_their_own(demo):
    """A flood of uploads (each up to 4 MiB to check and render) waits behind other uploads only:
    the k explorer and tree playback have their own line, model jobs the gate, and Gradio's queue
    holds well more than the gate lets through before it answers "queue full"."""
    import app

    groups = {}
    for fn in demo.fns.values():
        groups.setdefault(fn.name, set()).add((fn.concurrency_id, fn.concurrency_limit))
    assert groups["open_trace"] == {("upload", 1)}
    assert groups["explore"] == groups["play_tree"] == {("views", 1)}
    assert groups["run"] == {("model", None)}
    # each line is bounded on its own (tests/test_guard.py), so Gradio's one total never binds first
    lines = {fn.concurrency_id for fn in demo.fns.values()}
    assert demo._queue.max_size == app.QUEUE_PER_JOB * demo.specviz.limits.queue_size * len(lines)


def test_one_upload_request_holds_one_trace_and_an_address_a_few(demo):
    """Gradio writes every file of an upload request to disk (up to 1,000, each up to the size
    limit): 50 files of 1 MiB were 50 MiB on disk from one request in 0.4 s."""
    import httpx

    import app

    url = f"{demo.url}gradio_api/upload"
    many = [("files", (f"t{i}.json", b"x" * 2**20, "application/json")) for i in range(50)]
    r = httpx.post(url, files=many, headers={"X-Forwarded-For": "7.7.7.7"}, timeout=30)
    assert r.status_code == 413 and "a request (one trace, and a trace opens up to 4 MiB: open one that " \
        "specviz saved" in r.json()["detail"]  # the fix, not the size with the multipart slack alone
    one = [("files", ("t.json", b"{}", "application/json"))]
    codes = [httpx.post(url, files=one, headers={"X-Forwarded-For": "7.7.7.8"}, timeout=30).status_code
             for _ in range(app.UPLOADS_PER_ADDRESS + 1)]
    assert codes == [200] * app.UPLOADS_PER_ADDRESS + [429]


def test_what_an_opened_trace_leaves_in_gradios_cache_goes_once_old(demo, tmp_path):
    """Gradio puts an upload into a folder named by its content's sha256, and its cleaner deletes
    the file, not the folder; its File (type="filepath") makes an empty NamedTemporaryFile beside
    them and forgets it. One folder a distinct upload, and one file an opening, stayed for the life
    of the process."""
    import os
    import secrets
    import time
    from pathlib import Path

    from gradio_client import handle_file

    from specviz.hooks import HASH_NAME, TEMP_NAME

    tidy = demo.specviz.tidy
    cache = Path(tidy.cache)
    name = f"cleaned-{secrets.token_hex(4)}.json"
    path = tmp_path / name
    path.write_text(make_trace(demo).to_json() + " " * (1 + secrets.randbelow(4096)))  # its own content
    before = {p.name for p in cache.iterdir()}
    client(demo).predict(handle_file(str(path)), api_name="/open_trace")
    [file] = cache.glob(f"*/{name}")
    folder = file.parent
    assert folder.parent == cache and HASH_NAME.fullmatch(folder.name)
    empty = [p for p in cache.iterdir() if p.name not in before and p.is_file() and p.stat().st_size == 0]
    assert empty and all(TEMP_NAME.fullmatch(p.name) for p in empty)
    file.unlink()  # what Gradio's cleaner does, 15 to 20 minutes on
    for p in (folder, *empty):
        os.utime(p, (time.time() - tidy.files - 1,) * 2)
    tidy.last -= 3600  # due (it runs at most once a minute): the next opening runs it, as the app does
    path.write_text(make_trace(demo).to_json())
    client(demo).predict(handle_file(str(path)), api_name="/open_trace")
    assert not folder.exists() and not any(p.exists() for p in empty)


def test_deployment_limits_come_from_the_environment_and_the_readme_names_each(monkeypatch):
    import inspect
    from pathlib import Path

    names = re.findall(r"# (SPECVIZ_\w+)", inspect.getsource(Limits))
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert len(names) == 14 and [n for n in names if f"| `{n}` |" not in readme] == []
    monkeypatch.setenv("SPECVIZ_MAX_DOWNLOAD_GB", "7.5")
    assert (Limits().max_download_gb, Limits.from_env().max_download_gb) == (20.0, 7.5)
    monkeypatch.setenv("SPECVIZ_UPLOAD_MB", "64")
    monkeypatch.setenv("SPECVIZ_JOBS_PER_ADDRESS", "3")
    assert (Limits.from_env().upload_mb, Limits.from_env().jobs_per_address) == (64, 3)
    monkeypatch.setenv("SPECVIZ_UPLOAD_MB", "1")  # below one trace's worth: the floor
    assert Limits.from_env().upload_mb == 8
    for name, value in (("SPECVIZ_UPLOAD_MB", "lots"), ("SPECVIZ_MAX_PROMPT_CHARS", "1e4"),
                        ("SPECVIZ_MAX_JOB_SECONDS", "nan")):  # a typo stops start-up, naming it
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name}='{value}' is not a .*number: give one"):
            Limits.from_env()
        monkeypatch.setenv(name, " ")  # blank: the default
    assert Limits.from_env().upload_mb == Limits().upload_mb == 512
    assert Limits.from_env().max_job_seconds == 300.0
    assert [str(n) for n in Limits.from_env().trust_forwarded] == ["127.0.0.0/8", "::1/128"]
    monkeypatch.setenv("SPACE_ID", "someone/specviz")  # a Space's proxy reaches the app from 10.x
    assert [str(n) for n in Limits.from_env().trust_forwarded] == ["127.0.0.0/8", "::1/128", "10.0.0.0/8"]
    monkeypatch.setenv("SPECVIZ_TRUST_FORWARDED", "0")
    assert Limits.from_env().trust_forwarded == ()
    monkeypatch.delenv("SPACE_ID")
    for value in ("*", "127.0.0.1, *"):  # uvicorn then hands the app the visitor's own leftmost entry
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", value)
        with pytest.raises(ValueError, match=r"FORWARDED_ALLOW_IPS=\* lets a visitor pick .*: unset it"):
            Limits.from_env()
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1,172.17.0.1")  # named proxies: as uvicorn's
    assert Limits.from_env().trust_forwarded == ()
    monkeypatch.delenv("FORWARDED_ALLOW_IPS")
    for value, allowed in (("1", True), ("True", True), (" YES ", True), ("on", True), ("0", False),
                           ("False", False), ("", False)):  # any case, as HF's
        monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", value)
        assert Limits.from_env().allow_custom is allowed, value
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "maybe")  # read as off, silently, before
    with pytest.raises(ValueError, match="SPECVIZ_ALLOW_CUSTOM_MODELS='maybe' is not a switch"):
        Limits.from_env()
    monkeypatch.delenv("SPECVIZ_ALLOW_CUSTOM_MODELS")
    for value, allowed in (("ON", True), ("Off", False), ("", None)):
        monkeypatch.setenv("SPECVIZ_ALLOW_LARGE_MODELS", value)
        assert Limits.from_env().allow_large is allowed, value
    # on a Space, unset means off: a visitor's pick would start a 15 GB download in the model line
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    for value, allowed in (("ON", True), ("Off", False), ("", False)):
        monkeypatch.setenv("SPECVIZ_ALLOW_LARGE_MODELS", value)
        assert Limits.from_env().allow_large is allowed, value
    assert "off on this deployment" in presets.too_large("qwen2.5-7b", Limits.from_env().allow_large)


def test_saving_again_writes_nothing_new(demo):
    """Each save wrote a fresh copy of the trace under a random name, outside every budget, and
    Gradio copied each into its cache: 47 saves of a 3.3 MiB trace wrote 334 MiB in a minute.
    Then files were named by the page's key: opening one trace under eight made-up sessions and
    saving each wrote eight copies (33.7 MiB in 14 s). A file is named by its content now."""
    save = handler(demo, "save")
    trace = make_trace(demo)
    key, other = demo.specviz.shelf.put("saver", trace), demo.specviz.shelf.put("another", trace)
    first = save(key)
    stamp = os.stat(first).st_mtime_ns
    assert [save(key) for _ in range(5)] == [first] * 5 and os.stat(first).st_mtime_ns == stamp
    assert save(other) == first and open(first).read() == trace.to_json()
    changed = demo.specviz.shelf.put("a third", replace(trace, settings=trace.settings | {"seed": 12345}))
    assert save(changed) != first


def test_saves_are_utf8_and_all_saves_kept_at_once_stay_within_the_upload_budget(demo, monkeypatch,
                                                                                   tmp_path):
    """A save wrote an emoji as a 12-byte JSON escape (a 3 MiB upload saved as 9 MiB), and saves,
    kept 5 minutes and copied into Gradio's cache, had no budget: about 3.4 GB if the uploads'
    512 MiB were spent on them. Saves are UTF-8 now, and all saves kept at once are at most
    SPECVIZ_UPLOAD_MB, as uploads are."""
    import gradio as gr

    import app

    monkeypatch.setattr(app, "SAVES", tmp_path / "saves")
    save = handler(demo, "save")
    trace = make_trace(demo)
    spans = [replace(span, text="😀" * 50) for span in trace.spans]
    key = demo.specviz.shelf.put("emoji", replace(trace, spans=spans))
    path = save(key)
    data = open(path, "rb").read()
    assert ("😀" * 50).encode() in data and b"\\ud83d" not in data
    assert json.loads(data)["spans"][0]["text"] == "😀" * 50
    budget = demo.specviz.limits.upload_mb * 2**20
    with open(tmp_path / "saves" / "filler.json", "wb") as f:  # sparse: the budget's worth, no disk
        f.truncate(budget - len(data))
    assert save(key) == path  # a trace saved already is no new file
    other = demo.specviz.shelf.put("other", replace(trace, settings=trace.settings | {"seed": 7}))
    with pytest.raises(gr.Error, match="saved as many traces as it keeps at once: try again in 5 min"):
        save(other)
    old = time.time() - app.SAVE_TTL - 1
    os.utime(tmp_path / "saves" / "filler.json", (old, old))  # 5 minutes on: swept, room again
    assert save(other) != path and not (tmp_path / "saves" / "filler.json").exists()


def test_a_trace_too_large_to_open_again_is_not_saved_and_the_page_says_how_to_fit(demo, monkeypatch,
                                                                                  tmp_path):
    """A 512-token tree run of 64-node rounds made a 4.4 MiB trace: Save handed it out, and
    opening it was refused (over the 4 MiB cap)."""
    import gradio as gr

    import app
    from specviz.trace import MAX_TRACE_BYTES

    monkeypatch.setattr(app, "SAVES", tmp_path / "saves")
    save = handler(demo, "save")
    trace = make_trace(demo)
    def padded(n: int):  # the trace with its first token's text n characters long
        return replace(trace, spans=[replace(trace.spans[0], text="x" * n), *trace.spans[1:]])

    room = MAX_TRACE_BYTES - len(padded(0).to_json().encode())  # saved as UTF-8
    fits, big = padded(room), padded(room + 1)
    assert len(fits.to_json().encode()) == MAX_TRACE_BYTES == len(big.to_json().encode()) - 1
    with pytest.raises(gr.Error, match=r"this run's trace is 4\.1 MiB, over the 4 MiB a trace may be to "
                                       "open again .* run fewer new tokens or tree nodes"):
        save(demo.specviz.shelf.put("big", big))
    assert not list((tmp_path / "saves").glob("*.json"))
    assert len(open(save(demo.specviz.shelf.put("fits", fits)), "rb").read()) == MAX_TRACE_BYTES


def test_opening_a_file_that_is_gone_names_the_fix(demo):
    """Gradio passes any path inside its upload folder; one the cache cleaner removed (or one
    made up) raised FileNotFoundError: an empty error for the visitor, a traceback in the log."""
    import gradio as gr

    open_trace = handler(demo, "open_trace")
    request = page_request("gone")
    with pytest.raises(gr.Error, match="the uploaded file is gone .*upload the trace again"):
        list(open_trace("/nonexistent/specviz/missing.json", request))


def test_the_k_explorer_says_what_to_do_before_any_run(demo):
    """It showed an empty frame until a run: nothing said to run first."""
    shown = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "explorer-numbers")
    assert "Run at temperature 0 with the draft model or n-gram drafter first" in shown.value


def test_a_file_that_is_no_trace_is_refused_with_what_to_open_instead(demo, tmp_path):
    """A trace error said what was wrong inside the file ('"format" must be "specviz-trace"'),
    not what to do about it."""
    import gradio as gr

    open_trace = handler(demo, "open_trace")
    request = page_request("bad")
    for name, body in (("cut.json", '{"format": "specviz-trace", "vers'), ("other.json", '{"a": 1}')):
        (tmp_path / name).write_text(body)
        with pytest.raises(gr.Error, match=r"not a valid specviz trace: .*\. Open a file saved with "
                                           r"\"Save the last run as a trace\", whole and unedited"):
            list(open_trace(str(tmp_path / name), request))


def test_the_upload_progress_stream_is_closed(demo):
    """Each GET /upload_progress with a new id left an entry in Gradio's tracker for good (200
    of 12,000-character ids kept 2.3 MiB), and 1,200 streams polling one upload every 50 ms held
    a core. A 4 MiB trace needs no progress bar: the page is told at once that its upload is done
    (a 404 was two errors in its console on every trace opened), and Gradio never sees the id."""
    import httpx
    from gradio.route_utils import FileUploadProgressNotTrackedError
    from gradio.routes import file_upload_statuses

    r = httpx.get(f"{demo.url}gradio_api/upload_progress", params={"upload_id": "x" * 1_000}, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert r.text == 'data: {"msg": "done"}\n\n'
    with pytest.raises(FileUploadProgressNotTrackedError):
        file_upload_statuses.is_done("x" * 1_000)
    r = httpx.get(f"{demo.url}gradio_api/upload_progress", params={"upload_id": "x" * 12_000}, timeout=10)
    assert r.status_code == 414  # no address that long reaches Gradio


def test_the_page_s_own_pair_is_the_store_s_home(demo):
    """The pair a switch back to is never refused (test_service) is the page's default, fitted."""
    store, default = demo.specviz.store, demo.specviz.default
    assert store.home == store.key(default) == ("tiny", "tiny", "float32")
    other = replace(default, dtype="bfloat16")
    assert store.key(other) != store.home


def test_no_event_runs_outside_the_queue(demo):
    """Off a Space, Gradio opens /run/<name> by default: any handler, by name or index, without
    the queue's lines and bounds (48 parallel k-explorer calls there stalled the page for 14 s).
    What stays outside (Gradio's own: filling in an example, Stop, a copy in the browser) runs
    no Python of ours."""
    import httpx

    r = httpx.post(f"{demo.url}gradio_api/run/run", json={"data": args()}, timeout=10)
    assert r.status_code == 404 and "join the queue" in r.text
    for i, fn in demo.fns.items():
        r = httpx.post(f"{demo.url}gradio_api/run/predict", json={"data": [], "fn_index": i}, timeout=10)
        assert (r.status_code == 404 and "join the queue" in r.text) == fn.queue
        assert fn.queue or fn.fn is None or fn.name == "load_example"


def test_one_address_opens_a_bounded_number_of_traces(demo, tmp_path):
    """An uploaded trace could be opened any number of times, each open seconds of Python for a
    large one: 16 opens in flight from one address slowed another visitor's run from 0.7 s to
    6.4 s. An address may open as many traces as it may upload."""
    import httpx

    import app

    api = f"{demo.url}gradio_api"
    body = make_trace(demo).to_json().encode()
    uploaded = httpx.post(f"{api}/upload", files=[("files", ("t.json", body, "application/json"))],
                          timeout=30).json()[0]  # from loopback: not counted
    file = {"path": uploaded, "meta": {"_type": "gradio.FileData"}, "orig_name": "t.json"}

    def open_from(address: str) -> str:
        r = httpx.post(f"{api}/call/open_trace", json={"data": [file]}, timeout=30,
                       headers={"X-Forwarded-For": address})
        return httpx.get(f"{api}/call/open_trace/{r.json()['event_id']}", timeout=60).text

    answers = [open_from("7.7.9.9") for _ in range(app.UPLOADS_PER_ADDRESS + 1)]
    assert all("Opened:" in a for a in answers[:-1])
    assert "too many traces opened from your address: at most 16 in 20 minutes; wait a few" in answers[-1]
    assert "Opened:" in open_from("7.7.9.10")


def test_the_run_history_is_off_and_its_routes_closed(demo):
    """Gradio's run history is on by default, and its routes use the host's hub token for any
    request that looks local (a same-host proxy that forwards no address makes every visitor
    look local): a review watched it list and create buckets in the host's account."""
    import httpx

    assert demo.run_history is False
    for route in ["runs", "run-history/buckets", "run-history/records"]:
        assert httpx.get(f"{demo.url}gradio_api/{route}", timeout=10).status_code == 404


def test_the_mcp_server_stays_off_whatever_the_environment(monkeypatch):
    """GRADIO_MCP_SERVER=true would open MCP routes that none of the app's bounds know."""
    import app

    monkeypatch.setenv("GRADIO_MCP_SERVER", "true")
    from specviz.guard import PerAddress

    pages = PerAddress(4, 60)
    assert app.launch_options(SimpleNamespace(specviz=SimpleNamespace(limits=Limits(), pages=pages)))[
        "mcp_server"] is False


def test_server_side_rendering_stays_off_whatever_the_environment(monkeypatch):
    """A Space sets GRADIO_SSR_MODE=true: Gradio's Node proxy then takes the public port and answered
    a share link of the longest prompt 431 (its 16 KiB bound on a request's head), which the app opens."""
    import app

    monkeypatch.setenv("GRADIO_SSR_MODE", "true")
    from specviz.guard import PerAddress

    pages = PerAddress(4, 60)
    assert app.launch_options(SimpleNamespace(specviz=SimpleNamespace(limits=Limits(), pages=pages)))[
        "ssr_mode"] is False


def test_a_share_link_with_the_longest_prompt_opens_when_it_arrives_in_pieces(demo):
    """Over a network a request comes in segments: uvicorn's h11 refused (400) a head still
    incomplete past 16 KiB, a link of a 4,000-character Chinese prompt (36 KB) among them, though
    the guard admits it (on loopback it came in one piece and passed, or failed now and then). A
    head past the guard's longest query and room for headers is still refused."""
    import socket

    from specviz.guard import MAX_URL
    from specviz.hooks import HEAD_ROOM

    query = RunSettings(pair="tiny", prompt="斐" * demo.specviz.limits.max_prompt_chars).to_query()
    assert len(query) > 32 * 2**10
    host, port = demo.url.split("//")[1].rstrip("/").split(":")

    def status(head: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                for i in range(0, len(head), 1460):  # an Ethernet segment's payload
                    s.sendall(head[i:i + 1460])
                    time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the head was done: its answer may still be there to read
            try:
                return s.recv(64).split(b"\r\n")[0]
            except ConnectionResetError:
                return b""

    page = f"GET /?{query} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    assert status(page) == b"HTTP/1.1 200 OK"
    most = 12 * demo.specviz.limits.max_prompt_chars + 4096 + MAX_URL + HEAD_ROOM
    huge = f"GET / HTTP/1.1\r\nHost: {host}\r\nX-Pad: {'a' * 2 * most}\r\n\r\n".encode()
    assert status(huge) in (b"HTTP/1.1 400 Bad Request", b"")


def test_markdown_that_shows_a_visitors_text_renders_no_tex(demo):
    """markdown_text escapes Markdown but not "$": a link's ?pair=$$x^{2^{2}}$$ reached the
    notice, and Gradio's Markdown renders $$...$$ with KaTeX by default."""
    shown = [b for b in demo.blocks.values() if type(b).__name__ == "Markdown"
             and (b.elem_id == "status" or "specviz-notice" in (b.elem_classes or []) or not b.value)]
    assert len(shown) == 3 and all(b.latex_delimiters == [] for b in shown)


def test_a_share_link_with_the_longest_prompt_opens(demo):
    """Paths and queries are bounded (4 KiB), but the page's own query carries a share link's
    prompt, percent-encoded: a link of a 480-character Chinese prompt was refused (414)."""
    import httpx

    limits = demo.specviz.limits
    query = RunSettings(pair="tiny", prompt="斐" * limits.max_prompt_chars).to_query()
    assert len(query) > 4 * 2**10
    assert httpx.get(f"{demo.url}?{query}", timeout=10).status_code == 200
    assert httpx.get(f"{demo.url}gradio_api/info?{query}", timeout=10).status_code == 414
    # the page sends its query on joining the queue and reading results: the link's run went 414
    joined = httpx.post(f"{demo.url}gradio_api/queue/join?{query}", json={}, timeout=10)
    assert joined.status_code not in (413, 414) and "too long" not in joined.text
    data = f"{demo.url}gradio_api/queue/data?{query}&session_hash=nobody"
    with httpx.stream("GET", data, timeout=10) as read:  # past the query's bound: told its session
        assert read.status_code == 404 and b"no results to read" in read.read()  # has no results
    longer = f"{query}&x={'y' * (12 * limits.max_prompt_chars + 4096 - len(query))}"  # past the page's bound
    assert httpx.post(f"{demo.url}gradio_api/queue/join?{longer}", json={}, timeout=10).status_code == 414


def test_the_app_forgets_the_gradio_state_of_pages_gone_long_ago(demo, monkeypatch):
    """Gradio kept every page's state until 1,000 newer pages pushed it out, closed or not (about
    0.5 MiB a page after a run): a run now lets go of pages closed and unused past the grace."""
    import datetime

    import gradio as gr

    assert demo.specviz.tidy.cache == gr.File().GRADIO_CACHE  # the empty files' folder: Gradio's
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")  # the server sees a heartbeat end at once
    gone, other = client(demo), client(demo)
    gone.predict(*args(), api_name="/run")
    holder, page = demo.state_holder, gone.session_hash
    assert page in holder.session_data
    gone.close()  # its heartbeat ends (a page whose heartbeat is connected is open: it stays)
    end = time.monotonic() + 10
    while page in demo.specviz.beating and time.monotonic() < end:
        time.sleep(0.05)
    holder.session_data[page].is_closed = True  # as Gradio marks a page whose heartbeat ended
    holder.time_last_used[page] -= datetime.timedelta(seconds=demo.specviz.tidy.closed + 1)
    demo.specviz.tidy.last -= 3600  # due (it runs at most once a minute)
    other.predict(*args(), api_name="/run")
    assert page not in holder.session_data and other.session_hash in holder.session_data


# --- what each handler passes on and shows (a mutation test found these unguarded) ----------------


def test_at_most_eight_notices_are_listed_and_the_rest_counted():
    import app

    notices = [f"n{i}" for i in range(1, 11)]
    assert app.notices_text(notices) == "n1; n2; n3; n4; n5; n6; n7; n8; and 2 more"
    assert app.notices_text(notices[:8]) == "n1; n2; n3; n4; n5; n6; n7; n8"


def test_a_run_streams_its_tree_panel_and_hands_the_page_its_run_only_at_the_end(demo, monkeypatch):
    """While a tree run streams, the playback slider is not usable and the page keeps its last
    finished run (Stop leaves Save, the lab and the explorer on it); the finished run's slider is
    usable and stands on its fullest round, and the plots go to their own places."""
    import gradio as gr

    from specviz import service, treeview

    monkeypatch.setattr(service, "VIEW_SECONDS", 0.0)  # every round a view
    values = args(proposer="tree", k=3, nodes=8, branching=2, max_new_tokens=16, prompt="def f")
    shown = list(handler(demo, "run")(None, None, *values))
    streamed = [out for out in shown if str(out[0]).startswith("Speculative run: round")]
    assert streamed and all(out[-1] == gr.skip() and out[11]["interactive"] is False for out in streamed)
    # while it streams, the panel follows the newest round
    assert [out[11]["value"] for out in streamed] == [int(out[0].split("round ")[1]) for out in streamed]
    *_, last = shown
    trace = demo.specviz.shelf.get(last[-1])
    rounds = len(trace.events)
    fullest = treeview.fullest_round(trace.events)
    assert last[0].startswith("Done") and 1 < fullest < rounds  # the fullest round is not the last
    assert last[11]["interactive"] is True and (last[11]["value"], last[11]["maximum"]) == (fullest, rounds)
    figures = [fig.layout.title.text for fig in last[5:10]]
    assert figures == ["Tokens per target pass, by round", "Tokens against target passes",
                       "Acceptance by draft position", "Tokens per pass at k=3: measured",
                       "Tokens against wall-clock time"]
    demo.specviz.shelf.drop(last[-1])


def test_an_error_on_the_status_is_escaped_once(demo):
    """The toast's message is escaped for HTML; the status (Markdown) shows the visitor's text as
    typed, not its escapes escaped again (&amp;lt;)."""
    import gradio as gr

    shown = []
    with pytest.raises(gr.Error, match="unknown pair 'a&lt;b&gt;&amp;c'"):
        for out in handler(demo, "run")(None, None, *args(pair="a<b>&c")):
            shown.append(out)
    assert len(shown) == 1 and shown[0][1:] == (gr.skip(),) * 16
    assert shown[0][0] == "⚠ unknown pair \\'a&lt;b&gt;&amp;c\\'\\: pick one from the list"


def test_the_float32_rerun_runs_the_last_runs_settings_in_float32(demo):
    """The button runs the page's settings again in float32, whatever the page's dtype menu says
    (the dtype is the one setting it may differ in from the last run)."""
    trace = make_trace(demo, dtype="bfloat16")
    key = demo.specviz.shelf.put("rerun-float32", trace)
    values = [trace.settings[name] for name in FIELDS]
    rerun = handler(demo, "rerun_float32")
    for dtype in ("bfloat16", "auto"):
        values[FIELDS.index("dtype")] = dtype
        last = list(rerun(SimpleNamespace(query_params={}), None, key, *values))[-1]
        assert last[0].startswith("Done in float32"), (dtype, last[0])
        assert demo.specviz.shelf.get(last[-1]).settings["dtype"] == "float32"
        demo.specviz.shelf.drop(last[-1])
    demo.specviz.shelf.drop(key)


def test_a_page_load_takes_the_links_pair_says_its_notices_and_runs_only_on_run_1(model_dirs):
    import app
    from specviz.store import ModelStore

    pairs = {name: (str(model_dirs["target"]), str(model_dirs["draft"])) for name in ("tiny", "other")}
    built = app.build(ModelStore(pairs, device="cpu"), Limits(), RunSettings(pair="tiny", chat=False))
    load = handler(built, "on_load")
    link = {"pair": "other", "k": "6", "run": "1"}
    *controls, notice, autorun, run = load(SimpleNamespace(query_params=link))
    assert controls[0]["value"] == "other" and controls[FIELDS.index("k")] == 6
    assert notice == {"__type__": "update", "visible": False} and autorun is True
    assert run == {"__type__": "update", "interactive": True}  # Run waits for the link's settings
    *controls, notice, autorun, run = load(SimpleNamespace(query_params={"evil": "1"}))
    assert controls[0]["value"] == "tiny" and autorun is False and run["interactive"] is True
    assert notice == {"__type__": "update", "value": "⚠ ignored unknown link parameter \\'evil\\'",
                      "visible": True}


def test_picking_a_preset_sets_its_chat_template_switch(demo):
    import gradio as gr

    changed = handler(demo, "pair_changed")
    assert changed("gpt2") == {"__type__": "update", "value": False}  # a base model
    assert changed("qwen2.5-1.5b") == {"__type__": "update", "value": True}  # an instruct model
    assert changed("tiny") == {"__type__": "update", "value": False}  # the page's own pair: its default
    assert changed("other") == gr.skip() and changed(["gpt2"]) == gr.skip()


def test_the_lab_shows_the_masses_and_the_monte_carlo_each_in_its_own_plot(demo):
    info, masses, mc, table = list(handler(demo, "lab_run")("example", 1, 2000, ["exact"], None, None))[-1]
    assert "1 − TV(p, q) = <b>0.6000</b>" in info and "<table" in table
    assert masses.layout.title.text == "p, q, accepted mass and residual"
    assert mc.layout.title.text == "Monte Carlo: 2,000 rounds each"  # fits a phone's plot
    assert "2,000 trials (one-token rounds) per variant" in table


def test_the_end_to_end_check_says_how_many_of_its_samples_are_done(demo):
    shown = list(handler(demo, "e2e_run")(None, 10, *args(temperature=1.0, k=2)))
    progress = [out for out in shown if "Sampling:" in out]
    assert progress[0] == "<div class='specviz-lab'>Sampling: 1 of 20 samples…</div>"
    assert progress[-1] == "<div class='specviz-lab'>Sampling: 20 of 20 samples…</div>"
    assert "10 samples each of 3 tokens" in shown[-1]


def test_the_k_explorer_replays_the_pages_run_at_its_k(demo):
    """The explorer's numbers, re-laid text and curve go to their own places, the run's own k and
    measured rounds reach the replay, and the k slider moves to the run's k."""
    from specviz import labview

    trace = make_trace(demo, k=3)
    key = demo.specviz.shelf.put("explorer", trace)
    measured = [len(e.new_tokens) for e in trace.events]
    text, numbers, fig = labview.explorer_views(trace.recording, 5, False, 3, measured, None,
                                                trace.stats.prefilled_costs)
    got = handler(demo, "explore")(5, False, "", key)
    assert got[0] == numbers and got[1] == text and got[2].to_json() == fig.to_json()
    assert handler(demo, "explorer_k")(key) == 3 and "Measured run (k=3)" in numbers
    # a recording under another drafter's settings (an edited trace): its rounds are not the
    # replay's to check against
    hybrid = demo.specviz.shelf.put("explorer-hybrid", replace(trace, settings=trace.settings | {
        "proposer": "hybrid"}))
    assert "Measured run" not in handler(demo, "explore")(3, False, "", hybrid)[0]
    for held in (key, hybrid):
        demo.specviz.shelf.drop(held)


def test_the_lab_stop_cancels_the_labs_jobs_and_the_run_tabs_stop_every_model_job(demo):
    names = {fn._id: fn.name for fn in demo.fns.values()}
    stops = sorted((sorted(names[i] for i in fn.cancels) for fn in demo.fns.values() if fn.cancels), key=len)
    assert stops == [["e2e_run", "lab_run"], ["auto_run", "e2e_run", "lab_run", "rerun_float32", "run"]]


def test_an_opened_tree_trace_is_shown_whole_and_held_as_an_upload(demo, tmp_path):
    """An opened trace is a finished run: its playback slider is usable at once. The shelf holds
    it as an upload (the first to go over its budget), and a setting this deployment refuses is
    named in the status, after the trace's own view."""
    from specviz import treeview

    trace = make_trace(demo, proposer="tree", nodes=6, branching=2, max_new_tokens=16)
    path = tmp_path / "tree.json"
    path.write_text(trace.to_json())
    request = page_request("opener")
    *shown, key = list(handler(demo, "open_trace")(str(path), request))[-1][:17]
    slider, rounds = shown[11], len(trace.events)
    assert slider["interactive"] is True and slider["visible"] is True
    assert (slider["value"], slider["maximum"]) == (treeview.fullest_round(trace.events), rounds)
    assert demo.specviz.shelf._items[key].uploaded is True
    assert shown[8].layout.title.text == "Tokens per pass at k=3: measured"  # the run's k, as it ran
    status = list(handler(demo, "open_trace")(str(path), request))[-1][-1]
    assert status.endswith("Its settings are in the Run tab's controls: **Run** runs it again.")
    path.write_text(replace(trace, settings=trace.settings | {"max_new_tokens": 300}).to_json())
    last = list(handler(demo, "open_trace")(str(path), request))[-1]
    assert last[-1].endswith("**Run** runs it again (⚠ ignored trace setting max\\_new\\_tokens\\: max new "
                             "tokens must be in 1\\.\\.200, got 300 \\(kept 8\\)).")
    held = demo.specviz.shelf._items
    assert key not in held and last[16] in held  # the session's newest opening replaced its older one
    demo.specviz.shelf.drop(last[16])  # and leaves the shared page's shelf as it found it
    assert last[16] not in held


def test_the_lab_on_a_tree_round_tries_the_rounds_root_candidates(demo):
    import html

    from specviz import labview

    trace = make_trace(demo, proposer="tree", nodes=8, branching=2, max_new_tokens=12)
    key = demo.specviz.shelf.put("lab-tree", trace)
    root = labview.tree_root(trace, 1)
    assert len(root) == 2
    *_, table = list(handler(demo, "lab_run")("round", 1, 2000, ["tree_exact"], key, None))[-1]
    tokenizer = demo.specviz.store.current().tokenizer
    named = ", ".join(repr(tokenizer.decode([c])) for c in root)
    assert html.escape(f"candidates: {named}") in table
    demo.specviz.shelf.drop(key)


def test_the_auto_run_runs_only_once_a_run_1_link_has_set_its_state(demo):
    import gradio as gr

    auto = handler(demo, "auto_run")
    assert list(auto(None, None, False, *args())) == [(gr.skip(),) * 17]  # a page opened without run=1
    last = list(auto(None, None, True, *args(max_new_tokens=4)))[-1]
    assert last[0].startswith("Done") and demo.specviz.shelf.get(last[-1]) is not None
    demo.specviz.shelf.drop(last[-1])


def test_the_tree_playback_reads_a_run_made_here_with_the_loaded_pairs_tokenizer(demo):
    """The playback of a run this pair made names its nodes as the live page did, with the loaded
    tokenizer, not with the texts a trace carries for the tokens no span shows."""
    trace = make_trace(demo, proposer="tree", nodes=8, branching=2, max_new_tokens=12)
    assert trace.node_text  # refused or never-reached candidates
    marked = replace(trace, node_text={token: "QQMARK" for token in trace.node_text})
    key = demo.specviz.shelf.put("playback", marked)
    shown = [handler(demo, "play_tree")(n, key)[0] for n in range(1, len(trace.events) + 1)]
    assert all('data-round="' in page and "QQMARK" not in page for page in shown)
    demo.specviz.shelf.drop(key)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("seed", -1, "seed must be in 0..4294967295, got -1"),  # the seed box has no bounds
    ("seed", 2**32, "seed must be in 0..4294967295, got 4294967296"),
    ("top_k", 2**21, "top_k must be in 0..1048576"),  # nor the top-k box an upper one
    ("temperature", 0.001, "temperature must be 0 \\(greedy\\) or in 0.01..2"),  # typed in the slider's box
])
def test_a_link_of_settings_the_run_refuses_is_not_made(demo, field, value, message):
    """Copy link made a link of a seed the Run refuses; the page it opened showed the default seed
    in its place (with a notice to the visitor who got it, and nothing to the one who sent it)."""
    import gradio as gr

    made = RunSettings(**dict(zip(FIELDS, args(**{field: value}), strict=True))).to_query()
    _, notices, _ = from_query(dict(p.split("=", 1) for p in made.split("&")), RunSettings(),
                               demo.specviz.limits, demo.specviz.store.known_pairs)
    assert notices and field in notices[0]  # what the link would have opened with
    shown = []
    with pytest.raises(gr.Error, match=f"cannot make a link: {message}"):
        for out in handler(demo, "share_query")(*args(**{field: value})):
            shown.append(out)
    assert shown == [""]


def test_picking_the_pages_own_pair_again_sets_its_chat_switch_back(model_dirs):
    """The command-line pair (an instruct model: chat on) after a pick of gpt2 (chat off) kept the
    chat switch off, and its runs went without the chat template."""
    import app
    from specviz.store import ModelStore

    store = ModelStore({"command-line": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    built = app.build(store, Limits(), RunSettings(pair="command-line", chat=True))
    changed = handler(built, "pair_changed")
    assert changed("gpt2") == {"__type__": "update", "value": False}
    assert changed("command-line") == {"__type__": "update", "value": True}


def test_an_error_that_echoes_a_visitors_text_obeys_none_of_its_controls():
    """A custom model's name is echoed as typed ("GGUF file x.gguf does not exist"): its U+202E
    turned the rest of the error's toast around; the status beside it already showed it."""
    import app

    error = app.user_error(ValueError("GGUF file a\u202efudg.exe does not exist: check the path"))
    assert error.message == "GGUF file a⟨U+202E⟩fudg.exe does not exist: check the path"
    said = "⚠ GGUF file a\u202efudg.exe does not exist: check the path"
    assert app.error_outputs(error, 1) == markdown_text(said)  # the status, as before


def test_the_example_loader_refuses_what_is_not_an_example_and_logs_nothing(demo, capfd):
    """Gradio's `/run/load_example` runs outside the queue and indexed the list with what a call
    sent: each of these gave a 500 and a 2.3 KB traceback in the server's log."""
    import httpx

    import app

    url = f"{demo.url}gradio_api/run/load_example"
    capfd.readouterr()
    for data in ([None], ["x"], [10**9], [len(app.EXAMPLES)], [-1], [True], [{"a": 1}], [1e308], [[0]]):
        r = httpx.post(url, json={"data": data}, timeout=10)
        assert r.status_code == 500 and "pick one of the" in r.text, (data, r.text)
    assert "Traceback" not in capfd.readouterr().err
    r = httpx.post(url, json={"data": [1]}, timeout=10)
    assert r.status_code == 200 and r.json()["data"][0]["value"] == app.EXAMPLES[1]["prompt"]


def test_a_call_to_an_endpoint_the_app_does_not_have_is_refused_before_gradio(demo, capfd):
    """`/call/v2/<name>` (the API page's curl) looked an unknown name up with a KeyError: the
    connection reset and 2.9 KB of traceback in the log per call."""
    import httpx

    capfd.readouterr()
    for name in ("nonexist", "load_example", "x" * 200):
        r = httpx.post(f"{demo.url}gradio_api/call/v2/{name}", json={}, timeout=10)
        assert r.status_code == 404 and "no such endpoint in this app" in r.json()["detail"], name
    assert "Traceback" not in capfd.readouterr().err
    r = httpx.post(f"{demo.url}gradio_api/call/v2/e2e", json={}, timeout=10)  # the app's own: passes
    assert r.status_code == 200, r.text
    stream = httpx.get(f"{demo.url}gradio_api/call/e2e/{r.json()['event_id']}", timeout=30).text  # read
    assert "event: error" in stream and "set a temperature above 0" in stream, stream  # its defaults


def test_calls_and_reads_gradio_would_fail_with_a_traceback_are_refused_before_it(demo, capfd):
    """A helper's hostile review: each of these made Gradio log a traceback (1-6 KB a request,
    about 1 MiB of log a second from one address): reading the results of a session or event
    that has none (its stream had started before it raised its 404), a /call/, /run/ or /api/
    name or fn_index the app does not have, too few values outside the queue (the examples'
    loader) or in it (the run), and an event that runs in the browser only. Each is refused
    quietly, naming the fix; the app's own calls still work."""
    import httpx

    api = demo.url + "gradio_api"
    capfd.readouterr()
    for url in (f"{api}/queue/data?session_hash=made-up", f"{api}/call/run/made-up-event",
                f"{api}/call/v2/run/made-up-event", f"{api}/queue/data?session_hash=",  # blank: as Gradio
                f"{api}/queue/data?session_hash=made-up&session_hash="):  # reads it, the last one
        r = httpx.get(url, timeout=10)
        assert r.status_code == 404 and "no results to read" in r.json()["detail"], url
    for route in ("call", "run", "api"):
        for body in ({"data": [], "session_hash": "s1"}, {"data": []}):
            r = httpx.post(f"{api}/{route}/nope", json=body, timeout=10)
            assert r.status_code == 404 and "no such endpoint in this app" in r.json()["detail"], route
    browser_only = next(i for i, fn in demo.fns.items() if fn.fn is None and not fn.queue)
    for index in (10**6, str(10**6), browser_only, str(browser_only)):  # a string Gradio reads as a number
        r = httpx.post(f"{api}/run/predict", json={"data": [], "fn_index": index}, timeout=10)
        assert r.status_code == 404 and "no such endpoint" in r.text, (index, r.text)
    # /call/<name> looks its event up by name (its body has no fn_index: Gradio ignores one)
    r = httpx.post(f"{api}/call/nope", json={"data": [], "fn_index": 0}, timeout=10)
    assert r.status_code == 404 and "no such endpoint" in r.text, r.text
    r = httpx.post(f"{api}/call/e2e", json={"data": [], "fn_index": 10**6}, timeout=10)
    assert "no such endpoint" not in r.text and "values in 'data', got 0" in r.text, r.text  # the queue's
    for body in ({"data": [], "session_hash": "s1"}, {"data": [], "fn_index": next(
            i for i, fn in demo.fns.items() if fn.api_name == "load_example")}):
        r = httpx.post(f"{api}/run/load_example", json=body, timeout=10)
        assert r.status_code == 400 and "takes 1 values in 'data', got 0" in r.json()["detail"], r.text
    browser_only = next(i for i, fn in demo.fns.items() if fn.fn is None)
    run = next(i for i, fn in demo.fns.items() if fn.name == "run")
    for fn_index, data, said in ((browser_only, [None] * len(demo.fns[browser_only].inputs), "browser only"),
                                 (run, [1], f"takes {len(demo.fns[run].inputs)} values in 'data', got 1")):
        r = httpx.post(f"{api}/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": "s2",
                                                  "event_data": None, "trigger_id": None}, timeout=10)
        assert said in r.text, r.text
    opened = next(i for i, fn in demo.fns.items() if fn.name == "open_trace")  # its File input
    from gradio.utils import get_upload_folder

    for value in ({"path": "x.json", "meta": {"_type": "gradio.FileData"}}, "x", [], {"a": 1},
                  {"path": "/etc/passwd"}, {"path": 7},  # none uploaded: Gradio's checks logged each
                  {"path": f"{get_upload_folder()}/{'a' * 300}"}, {"path": f"{get_upload_folder()}/\ud800"}):
        body = json.dumps({"data": [value], "fn_index": opened, "session_hash": "s3"})  # \ud800 escaped
        r = httpx.post(f"{api}/queue/join", content=body, headers={"content-type": "application/json"},
                       timeout=10)
        assert "upload it first" in r.text, (value, r.text)
    assert "Traceback" not in capfd.readouterr().err
    # the app's own: the examples' loader, and an API call whose results are read
    r = httpx.post(f"{api}/run/load_example", json={"data": [1]}, timeout=10)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{api}/call/v2/e2e", json={}, timeout=10)  # its defaults filled in
    assert r.status_code == 200, r.text
    stream = httpx.get(f"{api}/call/e2e/{r.json()['event_id']}", timeout=30).text
    assert "event: error" in stream and "set a temperature above 0" in stream, stream
