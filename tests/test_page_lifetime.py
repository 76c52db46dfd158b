"""A page in use, or open in a browser, keeps what it shows over time: its run is never denied
under it ("run something first") after an hour of use, a connection blip, or an hour away from an
open tab."""

import json
import threading
import time

import httpx
import pytest
from test_hostile_app import call_hidden, make_trace

from specviz.settings import Limits, RunSettings

IDLE = 2.0  # app.TRACE_TTL here: seconds a page may go unused (an hour on a server)


@pytest.fixture(scope="module")
def served(model_dirs):
    from test_app import free_port

    import app
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(app, "TRACE_TTL", IDLE)  # the hour a page may go unused, shortened
        demo = app.build(store, Limits(max_new_tokens=200),
                         RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                **app.launch_options(demo))
    demo.url = f"http://127.0.0.1:{port}/"
    yield demo
    demo.close()


def test_a_page_in_use_is_never_told_to_run_first_under_the_run_it_shows(served, tmp_path, monkeypatch):
    """The page's trace key (the State `last`) had a time to live counted from when it was set
    (TRACE_TTL, an hour), not from its page's last use: a visitor who opened a trace (or ran
    one) and then spent an hour in the k explorer and the lab lost the run under the page that
    still showed it, and was told "no run to save yet: run something first" by Save, "Run at
    temperature 0 ... first" by the explorer and "no run yet" by the lab, all false. Here the
    hour is IDLE seconds, and the page is used every quarter of a second for twice as long."""
    from gradio_client import Client, handle_file

    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")  # a closed client's heartbeat ends at once
    path = tmp_path / "opened.json"
    path.write_text(make_trace(served, max_new_tokens=12).to_json())
    c = Client(served.url, verbose=False)
    c.predict(handle_file(str(path)), api_name="/open_trace")
    page = c.session_hash
    assert '"success":true' in call_hidden(served, "save", [None], page).replace(" ", "")
    end = time.monotonic() + 2 * IDLE
    while time.monotonic() < end:  # the visitor slides k in the explorer: the page is in use
        shown = call_hidden(served, "explore", [3, False, "", None], page)
        assert "first" not in shown, shown[-300:]
        time.sleep(0.25)
    saved = call_hidden(served, "save", [None], page)
    assert "run something first" not in saved, saved[-400:]
    # ... and a page left unused longer than that, its client gone (no heartbeat: an open page's
    # stays), still lets its run go (hooks.Tidy, next upload)
    shelf = served.specviz.shelf
    assert any(held.session == page for held in shelf._items.values())
    c.close()
    closed(served, page)
    time.sleep(IDLE + 1.5)
    served.specviz.tidy.last = -float("inf")  # it runs once a minute: now
    Client(served.url, verbose=False).predict(handle_file(str(path)), api_name="/open_trace")
    assert not any(held.session == page for held in shelf._items.values())


def open_page(served, tmp_path, name):
    """A page (session) that opened a trace, as the browser's does: (its session, the client)."""
    from gradio_client import Client, handle_file

    path = tmp_path / f"{name}.json"
    path.write_text(make_trace(served, max_new_tokens=12).to_json())
    c = Client(served.url, verbose=False)
    c.predict(handle_file(str(path)), api_name="/open_trace")
    page = c.session_hash
    assert '"success":true' in call_hidden(served, "save", [None], page).replace(" ", "")
    return page


def closed(served, page, seconds: float = 10.0) -> None:
    """Wait until the server has seen the page's heartbeat end: no stream of its counted, and
    Gradio has marked the page closed (its unload has run)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        state = served.state_holder.session_data.get(page)
        if page not in served.specviz.beating and getattr(state, "is_closed", False):
            return
        time.sleep(0.05)
    raise AssertionError(f"the page's heartbeat did not end within {seconds:g} s")


class Heartbeat:
    """The page's heartbeat stream (Gradio's page holds one open while it is open)."""

    def __init__(self, served, page):
        self.stop = threading.Event()
        self.opened = threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(served.url, page), daemon=True)
        self.thread.start()
        assert self.opened.wait(10)

    def _hold(self, url, page):
        with httpx.stream("GET", f"{url}gradio_api/heartbeat/{page}", timeout=60) as stream:
            for _ in stream.iter_lines():
                self.opened.set()
                if self.stop.is_set():
                    return  # the connection drops here (Wi-Fi to mobile data, a laptop's sleep)

    def drop(self):
        self.stop.set()
        self.thread.join(10)


def dropped_page(served, tmp_path, name, monkeypatch) -> str:
    """A page (its session) that opened a trace, held its heartbeat, and lost the connection
    while staying open: the server wrote its next beat, found the stream gone and ran the unload."""
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")  # Gradio notices a drop on its next beat
    page = open_page(served, tmp_path, name)
    beat = Heartbeat(served, page)
    time.sleep(0.5)
    beat.drop()
    closed(served, page)
    return page


def test_a_page_whose_connection_blipped_keeps_the_run_it_shows(served, tmp_path, monkeypatch):
    """Gradio's page opens its heartbeat stream once and never again (its client keeps the broken
    stream and open_heartbeat returns early). When that connection drops while the page stays open
    (a network change, a laptop's sleep, a proxy's idle cut), Gradio runs the unload handler, and
    free_session took the page's run off the shelf at once: the page goes on working (its events
    join the queue as before) and still shows its run, yet Save said "no run to save yet: run
    something first", the lab "no run yet" and the explorer "Run ... first"."""
    page = dropped_page(served, tmp_path, "blip", monkeypatch)
    saved = call_hidden(served, "save", [None], page)  # the visitor, still on the page, presses Save
    assert "run something first" not in saved, saved[-400:]
    shown = call_hidden(served, "explore", [3, False, "", None], page)
    assert "first" not in shown, shown[-300:]


def test_an_open_page_left_alone_past_the_hour_keeps_the_run_it_shows(served, tmp_path, monkeypatch):
    """TRACE_TTL is for pages that never close (API clients); a page open in a browser holds its
    heartbeat, and Gradio marks it closed when that ends. Tidy dropped the state of a page unused
    for TRACE_TTL although its heartbeat was still open: a visitor back at the open tab after an
    hour (lunch, a meeting) found the page showing its run, and Save said "no run to save yet: run
    something first" (the page's trace key had gone back to the default, None), the explorer
    "Run ... first". Here the hour is IDLE seconds."""
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")
    page = open_page(served, tmp_path, "away")
    beat = Heartbeat(served, page)
    try:
        time.sleep(IDLE + 1.0)  # the visitor is away; the tab stays open
        served.specviz.tidy.last = -float("inf")  # it runs at most once a minute: now
        served.specviz.tidy()
        saved = call_hidden(served, "save", [None], page)  # back at the tab
        assert "run something first" not in saved, saved[-400:]
    finally:
        beat.drop()


def test_a_page_let_go_after_its_connection_dropped_is_told_why(served, tmp_path, monkeypatch):
    """A page whose connection dropped (a laptop's sleep) is closed for Gradio, and once unused
    past the closed page's grace Tidy lets its state go, with its run: the page still shows the run,
    and Save said "run something first". It now says the server let the page go."""
    page = dropped_page(served, tmp_path, "slept", monkeypatch)
    monkeypatch.setattr(served.specviz.tidy, "closed", 1.0)  # ten minutes on a server
    time.sleep(1.5)
    served.specviz.tidy.last = -float("inf")  # it runs at most once a minute: now
    assert served.specviz.tidy()[0] >= 1  # the page's state went
    saved = call_hidden(served, "save", [None], page)  # the visitor, back, presses Save
    assert "no longer holds this page's state or its last run" in saved, saved[-400:]


def test_a_page_in_use_after_its_connection_dropped_keeps_its_run_past_the_hour(served, tmp_path,
                                                                                 monkeypatch):
    """Gradio deletes each State value of a page it marked closed an hour after the value was set
    (SessionState.STATE_TTL_WHEN_CLOSED), however recently the page was used. A page whose
    connection dropped while it stayed open (a laptop's sleep) never opens its heartbeat again:
    its visitor, still sliding k in the explorer, lost the run an hour after running it and was
    told the server no longer holds it. Here the hour is three seconds, counted from the page's
    first use after the drop; the page is used every quarter second for seven, through the
    explorer, the lab's example and a Save. (An hour of one second was shorter than a use under
    load: Gradio's expiry, each second, fell between two uses 1.3 s apart, or between a value set
    2.3 s before the hour was shortened and the first use after it.)"""
    hour = 3.0  # an hour on a server; longer than a use takes on a loaded machine
    page = dropped_page(served, tmp_path, "woken", monkeypatch)
    shown = call_hidden(served, "explore", [3, False, "", None], page)  # back: the hour starts here
    assert "no longer holds" not in shown and "first" not in shown, shown[-300:]
    state = served.state_holder.session_data[page]
    state.STATE_TTL_WHEN_CLOSED = hour
    end = time.monotonic() + 2 * hour + 1
    uses = ["explore", "lab", "save"]
    while time.monotonic() < end:
        use = uses[0]
        uses.append(uses.pop(0))
        if use == "explore":
            shown = call_hidden(served, "explore", [3, False, "", None], page)
        elif use == "lab":
            shown = call_hidden(served, "lab_run", ["example", 1, 1000, ["exact"], None], page)
        else:
            shown = call_hidden(served, "save", [None], page)
        assert "no longer holds" not in shown and "first" not in shown, (use, shown[-300:])
        time.sleep(0.25)
    # ... and a page unused for the hour loses it, told why (Gradio's own expiry, which runs each
    # second: waited for without using the page)
    unused = time.monotonic() + hour + 10
    while any(key in state.state_data for key in state._state_ttl) and time.monotonic() < unused:
        time.sleep(0.1)
    saved = call_hidden(served, "save", [None], page)
    assert "no longer holds this page's state or its last run" in saved, saved[-400:]


def test_a_saved_traces_link_lasts_as_its_label_says_and_saving_again_gives_a_working_one(
        model_dirs, tmp_path, monkeypatch):
    """Gradio's cleaner deletes the file a Save hands out CLEAN_CACHE[1] seconds after it was
    made: the link on the page then answers 404. The label says so, and Save again gives a link
    that works (the same trace, copied into the cache again). Here the cleaner runs every second
    and deletes what is two seconds old."""
    import re

    from test_app import free_port

    import app
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    monkeypatch.setattr(app, "CLEAN_CACHE", (1, 2))
    demo = app.build(store, Limits(max_new_tokens=200),
                     RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))
    labels = [getattr(block, "label", None) or "" for block in demo.blocks.values()]
    assert any(label.startswith("trace (download it within 0 minutes") for label in labels), labels
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                **app.launch_options(demo))
    demo.url = f"http://127.0.0.1:{port}/"
    try:
        page = open_page(demo, tmp_path, "saved")

        def link() -> str:
            saved = call_hidden(demo, "save", [None], page)
            return re.search(r'"url":\s*"([^"]+)"', saved)[1]

        first = link()
        assert httpx.get(first, timeout=10).status_code == 200
        end = time.monotonic() + 10
        while httpx.get(first, timeout=10).status_code == 200:  # the cleaner deletes it
            assert time.monotonic() < end, "the cleaner never deleted the saved file"
            time.sleep(0.25)
        again = link()
        answer = httpx.get(again, timeout=10)
        assert answer.status_code == 200 and json.loads(answer.text)["settings"], answer.text[:200]
    finally:
        demo.close()
