"""The bounds in front of Gradio's queue and upload route (specviz/guard.py, specviz/hooks.py), played
by one hostile client against a small Gradio app on loopback. Uvicorn trusts X-Forwarded-For from
loopback, so a test can speak from any public address."""

import asyncio
import json
import re
import threading
from types import SimpleNamespace

import httpx
import pytest

from specviz.gate import public_address
from specviz.guard import MIN_UPLOAD_CHARGE, PerAddress, Refused, RequestGuard
from specviz.hooks import LINKED, cap_queue, forbid_downloads, scan

PER_LINE, PER_ADDRESS, PAGES, MAX_CHARS, DEADLINE, MAX_VALUES = 6, 3, 8, 5000, 2.0, 200


@pytest.fixture(scope="module")
def server():
    """Two lines: `slow` (one handler, held until the test lets it go) and `fast`."""
    import gradio as gr
    from starlette.middleware import Middleware
    from test_app import free_port

    release, gate = threading.Event(), threading.Event()

    def slow(x):
        release.wait(30)
        return x

    def held(x):  # runs side by side until the test opens the gate
        gate.wait(20)
        return x

    with gr.Blocks() as demo:
        box = gr.Textbox()
        box.submit(slow, box, box, api_name="slow", concurrency_limit=1, concurrency_id="slow")
        box.change(lambda x: x, box, box, api_name="fast", concurrency_limit=1, concurrency_id="fast")
        box.blur(held, box, box, api_name="held", concurrency_limit=PER_ADDRESS + 1, concurrency_id="held")
    demo.queue()
    pages = PerAddress(PAGES, 60)
    cap_queue(demo._queue, per_line=PER_LINE, per_address=PER_ADDRESS, pages=pages, max_chars=MAX_CHARS)
    guard = Middleware(RequestGuard, max_body=2**16, max_upload=2**20, per_address=4,
                       upload_bytes=64 * 2**20, window=60, deadline=DEADLINE, pages=pages,
                       max_values=MAX_VALUES, max_page_query=40 * 2**10)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                max_file_size=2**20, app_kwargs={"middleware": [guard]})
    demo.url, demo.release, demo.gate = f"http://127.0.0.1:{port}/gradio_api", release, gate
    demo.fast = next(i for i, fn in demo.fns.items() if fn.api_name == "fast")
    demo.held = next(i for i, fn in demo.fns.items() if fn.api_name == "held")
    yield demo
    release.set()
    gate.set()
    demo.close()


def join(server, api: str, address: str | None = None) -> httpx.Response:
    headers = {"X-Forwarded-For": address} if address else {}
    return httpx.post(f"{server.url}/call/{api}", json={"data": ["x"]}, headers=headers, timeout=10)


def test_one_address_cannot_fill_a_line_and_a_full_line_leaves_the_others_open(server):
    try:
        first = join(server, "slow", "8.8.8.8")  # holds the line's one handler
        assert first.status_code == 200
        codes = [join(server, "slow", "8.8.8.8").status_code for _ in range(PER_ADDRESS + 2)]
        # the first one may still be waiting or already running: either way the address is capped
        assert codes.count(503) >= 2 and 200 in codes
        refused = join(server, "slow", "8.8.8.8")
        assert refused.status_code == 503 and "your address" in refused.json()["detail"]
        assert "wait for them to finish" in refused.json()["detail"]
        # others still get in, until the line itself is full ...
        others = [join(server, "slow", f"9.9.9.{i}").status_code for i in range(PER_LINE)]
        assert 503 in others
        full = join(server, "slow", "1.1.1.1")
        assert full.status_code == 503 and "this line" in full.json()["detail"]
        # ... and a full line does not close any other line (Gradio's own bound is one total)
        assert join(server, "fast", "1.1.1.1").status_code == 200
        # a private address (a proxy's) is not counted per address; the line bound still holds
        assert join(server, "slow").status_code == 503
    finally:
        server.release.set()


def upload(server, files: list[bytes], address: str, chunked: bool = False) -> httpx.Response:
    url, headers = f"{server.url}/upload", {"X-Forwarded-For": address}
    if not chunked:
        parts = [("files", (f"t{i}.json", body, "application/json")) for i, body in enumerate(files)]
        return httpx.post(url, files=parts, headers=headers, timeout=30)
    request = httpx.Request("POST", url, files=[("files", ("t.json", files[0], "application/json"))])
    body = request.read()
    headers["content-type"] = request.headers["content-type"]

    def stream():
        for i in range(0, len(body), 2**16):
            yield body[i:i + 2**16]

    return httpx.post(url, content=stream(), headers=headers, timeout=30)


def test_one_upload_request_writes_at_most_one_file_s_worth(server):
    """Gradio takes up to 1,000 files a request, each up to the size limit: 50 files of 512 KiB
    were 25 MiB on disk from one request, and 1,000 one-line files took 8 MiB of disk for 150 KB
    of body. Now an upload's body is bounded, declared or streamed, and holds one file."""
    many = upload(server, [b"x" * 2**19] * 50, "5.5.5.5")
    assert many.status_code == 413 and "1.0 MiB a request (one trace)" in many.json()["detail"]
    tiny = upload(server, [b"{}"] * 1000, "5.5.5.8")
    assert tiny.status_code == 413 and "one file an upload" in tiny.json()["detail"]
    assert upload(server, [b"{}"] * 2, "5.5.5.8").status_code == 413
    streamed = upload(server, [b"x" * 3 * 2**20], "5.5.5.6", chunked=True)
    assert streamed.status_code == 413
    fine = upload(server, [b'{"ok": 1}'], "5.5.5.7", chunked=True)
    assert fine.status_code == 200 and len(fine.json()) == 1


def test_one_address_has_a_bounded_number_of_uploads(server):
    codes = [upload(server, [b"{}"], "6.6.6.6").status_code for _ in range(5)]
    assert codes == [200] * 4 + [429]
    refused = upload(server, [b"{}"], "6.6.6.6")
    assert "at most 4 in 1 minutes" in refused.json()["detail"]
    assert upload(server, [b"{}"], "6.6.6.7").status_code == 200


def test_all_uploads_together_stay_within_the_disk_budget_over_the_window(monkeypatch):
    """Plain arithmetic on admit: an upload is charged its declared length while it runs, what
    it sent once done, and is forgotten after the window (the longest a file stays on disk)."""
    import specviz.guard

    clock = [0.0]
    monkeypatch.setattr(specviz.guard.time, "monotonic", lambda: clock[0])
    guard = RequestGuard(None, max_body=10, max_upload=100, per_address=2, upload_bytes=250, window=10,
                         min_charge=5)

    def refused(address, declared) -> tuple[int, str]:
        with pytest.raises(Refused) as e:
            guard.admit(address, declared)
        return e.value.status, e.value.message

    declared, undeclared = guard.admit(None, 100), guard.admit(None, None)  # 100 + 100 charged
    assert declared[1] == undeclared[1] == 100
    status, message = refused(None, 60)  # 200 + 60 > 250
    assert status == 429 and "try again later" in message
    assert guard.admit(None, 50) and sum(e[1] for e in guard.recent) == guard.charged == 250
    assert refused(None, 101)[0] == 413
    guard.settle(undeclared, 10)  # it ended having sent 10 bytes: 160 charged
    assert guard.charged == 160
    assert guard.admit(None, 90) and refused(None, 1)[0] == 429  # one byte is charged min_charge, 5
    guard.settle(declared, 2)  # ended after 2 bytes: charged min_charge, 5
    assert guard.charged == 155 and guard.admit(None, 0)[1] == 5 and guard.charged == 160
    clock[0] = 9.9  # inside the window the files may still be on disk: still charged
    assert refused(None, 100)[0] == 429 and guard.charged == 160
    clock[0] = 10.0  # the window has passed: everything before is forgotten (cleaned from disk)
    assert guard.admit("8.8.8.8", 100) and len(guard.recent) == 1
    assert guard.admit("8.8.8.8", 1) and refused("8.8.8.8", 1)[0] == 429


def test_any_request_body_is_bounded(server):
    """A 200 MB JSON body to /queue/join took 0.8 GiB of server memory, and its event stayed
    queued with it. Now any body over max_body is refused, declared or streamed."""
    big = {"data": ["x" * 2**17], "session_hash": "s", "fn_index": 0}
    declared = httpx.post(f"{server.url}/queue/join", json=big, timeout=10)
    assert declared.status_code == 413 and "0.1 MiB a request" in declared.json()["detail"]
    body = json.dumps(big).encode()
    streamed = httpx.post(f"{server.url}/queue/join", timeout=10,
                          content=(body[i:i + 4096] for i in range(0, len(body), 4096)),
                          headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert join(server, "fast", "2.2.2.2").status_code == 200


@pytest.mark.parametrize("path", ["https://example.com/huge.bin", "http://10.0.0.1/x", "data:,x",
                                  "file:///etc/passwd", "HTTPS://EXAMPLE.COM/a"])
def test_an_event_naming_a_file_by_url_is_refused_before_gradio_downloads_it(server, path):
    """Gradio downloads a file input given as a URL into its cache, with no size bound."""
    file = {"path": path, "meta": {"_type": "gradio.FileData"}}
    for data in ([file], [[{"nested": file}]]):
        r = httpx.post(f"{server.url}/call/fast", json={"data": data}, timeout=10)
        assert r.status_code == 400 and r.json()["detail"] == LINKED


def test_links_a_file_sees_urls_only():
    assert not scan([{"path": "/tmp/gradio/abc/t.json"}, {"path": "C:\\x\\t.json"}, "https://x"])[0]
    assert not scan({"url": "https://x/gradio_api/file=/tmp/t.json", "path": "/tmp/t.json"})[0]
    assert scan([1, [{"a": {"path": "s3://bucket/key"}}]])[0]


def page(server, session: str, address: str | None = "4.4.4.4", read: bool = True) -> int:
    """Join the fast line as a page would (the status code), and read the result unless told not to."""
    headers = {"X-Forwarded-For": address} if address else {}  # none: loopback, not counted
    r = httpx.post(f"{server.url}/queue/join", timeout=10, headers=headers,
                   json={"data": ["x"], "fn_index": server.fast, "session_hash": session})
    if r.status_code == 200 and read:
        stream = httpx.get(f"{server.url}/queue/data", params={"session_hash": session},
                           headers=headers, timeout=10).text
        assert "process_completed" in stream
    return r.status_code if r.status_code == 200 else r.json()["detail"]


def test_one_address_cannot_make_up_pages_enough_to_expire_everyone_else_s(server):
    """Gradio keeps state for SPECVIZ_MAX_SESSIONS pages and drops the least recently used: one
    client making up session hashes (or calling without one) expired every other page."""
    assert [page(server, f"s{i}") for i in range(PAGES)] == [200] * PAGES
    assert "too many pages from your address" in page(server, "one-more")
    assert page(server, "s0") == 200  # an open page goes on
    assert page(server, "one-more", "4.4.4.5") == 200  # another address is not affected
    calls = []
    for _ in range(PAGES + 1):  # each call without a session is a fresh page
        r = join(server, "fast", "4.4.4.6")
        calls.append(r.status_code)
        if r.status_code == 200:
            httpx.get(f"{server.url}/call/fast/{r.json()['event_id']}", timeout=10)
    assert calls == [200] * PAGES + [503]
    assert [page(server, f"local-{i}", None) for i in range(PAGES + 1)] == [200] * (PAGES + 1)


def test_results_never_read_count_against_the_address(server):
    """A result waits in server memory until its client reads it: joining again and again
    without reading (2.3 MiB results of an opened trace) grew the server by 145 MiB in 40."""
    unread = [page(server, f"u{i}", "3.3.3.3", read=False) for i in range(PER_ADDRESS + 1)]
    assert unread[:PER_ADDRESS] == [200] * PER_ADDRESS and "waiting or unread" in unread[-1]
    httpx.get(f"{server.url}/queue/data", params={"session_hash": "u0"}, timeout=10,
              headers={"X-Forwarded-For": "3.3.3.3"})  # read one
    assert page(server, "u-next", "3.3.3.3", read=False) == 200
    assert "waiting or unread" in page(server, "u-last", "3.3.3.3")


def test_results_unread_long_after_they_finished_are_dropped_from_server_memory(server, monkeypatch):
    """Gradio keeps a result until its client reads it: one that calls and never reads left a run's
    views (tens of MiB) behind for good, and after UNREAD_SECONDS they merely stopped counting, so
    the address could leave as many again. Now they are dropped, messages and pending ids."""
    import time
    from types import SimpleNamespace

    from specviz import hooks

    clock = [time.monotonic()]  # the queue cap's clock, moved by hand: no test timing decides
    monkeypatch.setattr(hooks, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    sessions = [f"late{i}" for i in range(PER_ADDRESS)]
    assert [page(server, s, "5.5.5.9", read=False) for s in sessions] == [200] * PER_ADDRESS
    assert page(server, "late-local", None, read=False) == 200  # loopback: not counted, dropped too
    sessions.append("late-local")
    queue, deadline = server._queue, time.monotonic() + 10

    def live() -> bool:
        return any(e.session_hash in sessions for lane in queue.event_queue_per_concurrency_id.values()
                   for e in lane.queue) or any(job.session_hash in sessions for jobs in queue.active_jobs
                                                if jobs for job in jobs)

    while live() and time.monotonic() < deadline:
        time.sleep(0.1)  # all finished, none read
    assert not live()

    def kept() -> int:
        return sum(1 for s in sessions for m in list(queue.pending_messages_per_session[s]._queue)
                   if getattr(m, "event_id", None))

    assert kept() >= len(sessions) and all(queue.pending_event_ids_session.get(s) for s in sessions)
    assert "waiting or unread" in page(server, "late-next", "5.5.5.9")  # seen finished by now
    clock[0] += hooks.UNREAD_SECONDS - 1
    assert "waiting or unread" in page(server, "late-next", "5.5.5.9")  # not yet long enough
    assert kept() >= len(sessions)
    clock[0] += 2
    assert page(server, "late-next", "5.5.5.9") == 200
    assert kept() == 0 and not any(queue.pending_event_ids_session.get(s) for s in sessions)


def test_one_ipv6_48_holds_no_more_events_than_the_gate_lets_it(server):
    """Each /56 counts as an address of its own, and a free tunnel /48 holds 256 of them: enough
    to fill every line (the gate capped a /48 already; the queue in front of it did not)."""
    first = [page(server, f"net{i}", f"2a01:4f8:1:{i}00::1", read=False) for i in range(PER_ADDRESS)]
    assert first == [200] * PER_ADDRESS  # three /56s of one /48, one event each
    refused = page(server, "net-next", "2a01:4f8:1:f00::1", read=False)
    assert "your network (2a01:4f8:1::/48) already has 3 events waiting or unread" in refused
    assert page(server, "net-other", "2a01:4f8:2::1", read=False) == 200  # another /48
    for i in range(PER_ADDRESS):  # read: the /48 is free again
        httpx.get(f"{server.url}/queue/data", params={"session_hash": f"net{i}"}, timeout=10,
                  headers={"X-Forwarded-For": f"2a01:4f8:1:{i}00::1"})
    assert page(server, "net-next", "2a01:4f8:1:f00::1") == 200


def test_a_page_closed_while_its_event_runs_no_longer_counts_against_the_address(server):
    """Gradio keeps the id of an event whose page closed mid-run pending for good (nothing more of
    it is sent or kept): 16 tabs closed mid-run from one address had it refused every event."""
    import time

    headers = {"X-Forwarded-For": "7.7.7.7"}
    try:
        for i in range(PER_ADDRESS):
            r = httpx.post(f"{server.url}/queue/join", timeout=10, headers=headers,
                           json={"data": ["x"], "fn_index": server.held, "session_hash": f"tab{i}"})
            assert r.status_code == 200
            with httpx.stream("GET", f"{server.url}/queue/data", params={"session_hash": f"tab{i}"},
                              headers=headers, timeout=10) as stream:
                next(line for line in stream.iter_lines() if "process_starts" in line)
            # the tab closes while its event runs
        queue, deadline = server._queue, time.monotonic() + 20
        running = lambda: [job for jobs in queue.active_jobs if jobs for job in jobs  # noqa: E731
                           if job.session_hash.startswith("tab") and job.alive]
        while running() and time.monotonic() < deadline:  # Gradio notices within ~10 s
            time.sleep(0.2)
        assert not running()
        assert page(server, "tab-next", "7.7.7.7") == 200  # the address is free again
        kept = queue.pending_messages_per_session
        left = [m for i in range(PER_ADDRESS) if kept.get(f"tab{i}") is not None
                for m in list(kept.get(f"tab{i}")._queue) if getattr(m, "event_id", None)]
        assert not left  # nothing the closed tabs' events had queued is kept for them
    finally:
        server.gate.set()


def test_results_that_finished_stay_counted_when_their_page_drops_its_stream(server):
    """Only what Gradio dropped on the disconnect is forgotten: a client that let its results
    finish, then opened and dropped a stream, held 18 unread results where the bound is 3."""
    import socket
    import time
    from urllib.parse import urlparse

    for _ in range(PER_ADDRESS):
        assert page(server, "drop", "7.7.7.8", read=False) == 200
    queue = server._queue
    deadline = time.monotonic() + 10
    while any(e.session_hash == "drop" for lane in queue.event_queue_per_concurrency_id.values()
              for e in lane.queue) and time.monotonic() < deadline:
        time.sleep(0.1)  # all finished, none read
    url, cleaned, clean = urlparse(server.url), threading.Event(), queue.clean_events

    async def spy(**kwargs):  # Gradio cleans the page's events once it sees the hang-up
        await clean(**kwargs)
        if kwargs.get("session_hash") == "drop":
            cleaned.set()

    queue.clean_events = spy
    try:
        with socket.create_connection((url.hostname, url.port)) as s:  # open the stream, hang up
            s.sendall(f"GET {url.path}/queue/data?session_hash=drop HTTP/1.1\r\nHost: x\r\n"
                      "X-Forwarded-For: 7.7.7.8\r\n\r\n".encode())
        deadline = time.monotonic() + 15  # Gradio cleans them, or had sent them before it saw the hang-up
        while not cleaned.is_set() and queue.pending_event_ids_session.get("drop") and \
                time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        queue.clean_events = clean
    held = [m for m in list(queue.pending_messages_per_session["drop"]._queue)
            if m.msg == "process_completed"]
    # what Gradio sent down the stream before it saw the hang-up was read, and is gone; the
    # results it still keeps count against the address, each of them
    free = PER_ADDRESS - len(held)
    assert [page(server, f"drop-{i}", "7.7.7.8", read=False) for i in range(free)] == [200] * free
    assert "waiting or unread" in page(server, "drop-last", "7.7.7.8", read=False)


def test_an_event_the_app_lacks_or_a_long_session_is_refused_before_gradio_keeps_a_page(server):
    """Gradio made a page state for each before refusing (or after passing) the event: 1,001
    such calls from one address expired another visitor's run, and 900 KB session hashes pinned
    0.75 GiB."""
    before = len(server.state_holder.session_data)
    r = httpx.post(f"{server.url}/queue/join", timeout=10, headers={"X-Forwarded-For": "6.6.6.1"},
                   json={"data": ["x"], "fn_index": 999, "session_hash": "nosuch"})
    assert r.status_code == 400 and "no such event" in r.json()["detail"]
    long = "s" * 65
    r = httpx.post(f"{server.url}/queue/join", timeout=10, headers={"X-Forwarded-For": "6.6.6.1"},
                   json={"data": ["x"], "fn_index": server.fast, "session_hash": long})
    assert r.status_code == 400 and "at most 64 characters" in r.json()["detail"]
    r = httpx.post(f"{server.url}/call/fast", timeout=10, headers={"X-Forwarded-For": "6.6.6.1"},
                   json={"data": ["x"], "session_hash": long})
    assert r.status_code == 400 and "at most 64 characters" in r.json()["detail"]
    r = httpx.get(f"{server.url}/heartbeat/{long}", timeout=10, headers={"X-Forwarded-For": "6.6.6.1"})
    assert r.status_code == 400
    assert "nosuch" not in server.state_holder.session_data and long not in server.state_holder.session_data
    # a /call/ that names its session is one of its address's pages, counted before Gradio makes it
    codes = []
    for i in range(PAGES + 1):
        r = httpx.post(f"{server.url}/call/fast", timeout=10, headers={"X-Forwarded-For": "6.6.6.2"},
                       json={"data": ["x"], "session_hash": f"c{i}"})
        codes.append(r.status_code)
        if r.status_code == 200:  # read the result
            httpx.get(f"{server.url}/call/fast/{r.json()['event_id']}", timeout=10)
    assert codes == [200] * PAGES + [429]
    assert f"c{PAGES}" not in server.state_holder.session_data
    assert len(server.state_holder.session_data) <= before + PAGES


@pytest.mark.parametrize("route", ["run", "api"])
def test_a_session_named_to_run_or_api_is_a_page_of_its_address_too(server, route):
    """Gradio's /run/<x> and /api/<x> make the body's session's page state before they refuse a
    queued event: 1,100 made-up sessions from one address there expired every other visitor's
    page in 33 s, and 900 KB session hashes pinned 0.9 GiB, past the bounds /call/ has."""
    long = "s" * 65
    r = httpx.post(f"{server.url}/{route}/predict", timeout=10, headers={"X-Forwarded-For": "6.6.7.1"},
                   json={"data": ["x"], "fn_index": server.fast, "session_hash": long})
    assert r.status_code == 400 and "at most 64 characters" in r.json()["detail"]
    before = len(server.state_holder.session_data)
    address = {"run": "6.6.7.2", "api": "6.6.7.3"}[route]
    codes = [httpx.post(f"{server.url}/{route}/predict", timeout=10, headers={"X-Forwarded-For": address},
                        json={"data": ["x"], "fn_index": server.fast, "session_hash": f"{route}{i}"}
                        ).status_code for i in range(PAGES + 1)]
    assert 429 not in codes[:PAGES] and codes[PAGES] == 429
    assert f"{route}{PAGES}" not in server.state_holder.session_data
    assert long not in server.state_holder.session_data
    assert len(server.state_holder.session_data) <= before + PAGES


def test_long_addresses_are_refused_and_an_upload_id_is_dropped(server):
    """Gradio kept a progress entry for every upload_id for good (400 uploads with 120 KB ids: +43 MiB)."""
    r = httpx.get(f"{server.url}/info", params={"x": "y" * 5000}, timeout=10)
    assert r.status_code == 414 and "at most 4,096 characters" in r.json()["detail"]
    assert httpx.get(f"{server.url}/" + "x" * 5000, timeout=10).status_code == 414  # a path too
    files = {"files": ("t.json", b"{}", "application/json")}
    r = httpx.post(f"{server.url}/upload", params={"upload_id": "u" * 4000}, files=files, timeout=10,
                   headers={"X-Forwarded-For": "6.6.6.3"})
    assert r.status_code == 200 and len(r.json()) == 1  # the upload itself goes through
    r = httpx.post(f"{server.url}/upload?upload%5Fid=" + "v" * 4000, files=files, timeout=10,
                   headers={"X-Forwarded-For": "6.6.6.3"})  # the name percent-encoded
    assert r.status_code == 200
    from gradio.routes import file_upload_statuses

    assert not [k for k in file_upload_statuses._statuses if k.startswith(("uuu", "vvv"))]
    # the page itself takes a share link's query: its prompt, percent-encoded
    root = server.url.removesuffix("/gradio_api")
    assert httpx.get(f"{root}/", params={"prompt": "斐" * 4000}, timeout=10).status_code == 200  # 36 KB
    assert httpx.get(f"{root}/", params={"prompt": "斐" * 5000}, timeout=10).status_code == 414  # 45 KB


def test_one_ipv6_48_makes_at_most_its_share_of_pages_opens_and_uploads(monkeypatch):
    """Each /56 counted as a whole client here, though a free tunnel /48 is 256 of them: 17 /56s
    made enough pages to expire every other visitor's, 8 filled the server's upload budget, and
    one /48 could open 4,096 traces (seconds of a core each) in 20 minutes. Now a /48 has a bound
    of its own: pages, opens (PerAddress) and uploads (RequestGuard)."""
    import specviz.guard

    def net(i: int) -> str:  # the i-th /56 of one /48, as public_address names it
        return public_address(f"2a01:4f8:1:{i:x}00::1")

    pages = PerAddress(per_address=2, window=10, per_network=5)
    made = [pages.admit(net(i), f"s{i}-{j}", 0) for i in range(4) for j in range(2)]
    assert made == [True] * 5 + [False] * 3  # four /56s of one /48: five pages between them
    assert "from your network (2a01:4f8:1::/48): 5 in 0 minutes" in pages.refuse(net(4), "s4-0", 0)
    assert pages.admit(net(0), "s0-0", 1)  # a page it has, used again
    assert pages.admit(public_address("2a01:4f8:2::1"), "t", 1)  # another /48
    assert pages.admit("8.8.8.8", "u", 1) and pages.admit("8.8.8.8", "v", 1)
    assert "from your address: 2 in 0 minutes" in pages.refuse("8.8.8.8", "w", 1)
    assert pages.admit(net(3), "s3-0", 11)  # the window has passed: room again
    opens = PerAddress(per_address=16, window=1200)  # by default a /48: four addresses' worth
    assert sum(opens.admit(net(i), None, 0) for i in range(256) for _ in range(16)) == 64

    clock = [0.0]
    monkeypatch.setattr(specviz.guard.time, "monotonic", lambda: clock[0])
    guard = RequestGuard(None, max_body=10, max_upload=100, per_address=2, upload_bytes=1600, window=10,
                         min_charge=1)
    assert guard.per_network == 4  # a quarter of the 16 full uploads the budget holds
    for i in range(2):
        guard.admit(net(i), 100)
        guard.admit(net(i), 100)
    with pytest.raises(Refused) as e:
        guard.admit(net(2), 100)
    assert e.value.status == 429 and "from your network (2a01:4f8:1::/48): at most 4" in e.value.message
    assert guard.admit(public_address("2a01:4f8:2::1"), 100) and guard.admit("9.9.9.9", 100)  # others
    clock[0] = 10.0  # forgotten with the window
    assert guard.admit(net(2), 100) and not guard.by_network.get("2a01:4f8:2::/48")


def test_pages_are_forgotten_after_the_window():
    pages = PerAddress(per_address=2, window=10)
    assert pages.admit("a", "s1", 0) and pages.admit("a", "s2", 1) and not pages.admit("a", "s3", 2)
    assert pages.admit("a", "s1", 9)  # an open page, used again: its window starts anew
    assert pages.admit("a", "s3", 11)  # s2 (last used at 1) is forgotten
    assert not pages.admit("a", "s4", 12) and pages.admit("b", "s4", 12)
    assert pages.admit("a", None, 25) and pages.admit("a", None, 25) and not pages.admit("a", None, 25)


@pytest.mark.parametrize("route", ["file=https://example.com/big.bin", "file/http://10.0.0.1/x",
                                   "file=HTTP://example.com/x", "proxy=https://example.com/x"])
def test_the_server_fetches_no_url_for_a_client(server, route):
    """/gradio_api/file=<url> relayed any public URL (100 MiB in 0.6 s, no read timeout)."""
    for method in ("GET", "HEAD"):
        r = httpx.request(method, f"{server.url}/{route}", timeout=10)
        assert r.status_code == 403
    assert "fetches no URLs" in httpx.get(f"{server.url}/{route}", timeout=10).json()["detail"]


def test_no_data_can_be_swapped_into_a_queued_event(server):
    """POST /stream/{event_id} replaced a queued event's data after the URL check had passed it,
    and Gradio then downloaded the URL it named (300 MiB in one test)."""
    r = join(server, "fast", "2.2.2.3")
    file = {"path": "https://example.com/huge.bin", "meta": {"_type": "gradio.FileData"}}
    swap = httpx.post(f"{server.url}/stream/{r.json()['event_id']}", json={"data": [file]}, timeout=10)
    assert swap.status_code == 404 and "no streaming input" in swap.json()["detail"]


def test_gradio_downloads_nothing_once_forbidden():
    """The same, where it happens: a file input given as a URL is refused, not fetched."""
    import asyncio

    import gradio as gr

    forbid_downloads()
    with pytest.raises(ValueError, match="must be uploaded, not linked"):
        asyncio.run(gr.File().async_move_resource_to_block_cache("https://example.com/huge.bin"))
    with pytest.raises(ValueError, match="must be uploaded, not linked"):
        gr.File().move_resource_to_block_cache("https://example.com/huge.bin")


def test_routes_the_app_does_not_use_are_closed(server):
    """deep_link wrote a page's whole state (inputs included) to disk, never cleaned: 535 MiB in
    45 s from one page; component_server made a page state for any session hash; each
    dev/reload stream polled every 50 ms for ever (4,000 slowed a page load from 0.07 s to 3.1 s);
    the run history acted with the host's hub token for requests that looked local."""
    r = httpx.get(f"{server.url}/deep_link", params={"session_hash": "x"}, timeout=10)
    assert r.status_code == 404 and r.json()["detail"] == "not offered by this app"
    r = httpx.post(f"{server.url}/component_server", json={"session_hash": "x"}, timeout=10)
    assert r.status_code == 404 and r.json()["detail"] == "not offered by this app"
    for route in ["dev/reload", "runs", "run-history/buckets", "run-history/records/a/b/assets/c",
                  "process_recording", "vibe-code/", "deep_link/"]:
        r = httpx.get(f"{server.url}/{route}", timeout=10)  # dev/reload never ended: 4,000 held
        assert r.status_code == 404 and r.json()["detail"] == "not offered by this app", route
    root = server.url.removesuffix("/gradio_api")
    assert httpx.get(f"{root}/monitoring", timeout=10).status_code == 404
    assert httpx.get(f"{root}/monitoring/summary", timeout=10).status_code == 404
    assert httpx.get(f"{root}/config", timeout=10).status_code == 200  # the page's own routes
    assert httpx.get(f"{server.url}/info", timeout=10).status_code == 200


def test_a_heartbeat_counts_as_one_of_its_address_s_pages(server):
    """A heartbeat names a session, and when it drops Gradio runs the page's unload outside the
    queue, making a page state: 1,100 dropped heartbeats expired another visitor's page."""
    def beat(session: str) -> int:
        url = f"{server.url}/heartbeat/{session}"
        with httpx.stream("GET", url, headers={"X-Forwarded-For": "4.4.4.10"}, timeout=10) as r:
            return r.status_code

    assert [beat(f"h{i}") for i in range(PAGES)] == [200] * PAGES
    assert beat("h-more") == 429 and beat("h0") == 200
    assert page(server, "h1", "4.4.4.10") == 200  # the same page's events: no new page
    assert "too many pages" in page(server, "h-other", "4.4.4.10")


def test_a_body_that_does_not_arrive_in_time_is_cut(server):
    """An upload declaring 4 MiB and sending one byte held its charge of the upload budget for as
    long as the client liked: 128 such from 8 addresses refused every visitor's upload."""
    import socket
    import time

    host, port = server.url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        start = time.monotonic()  # before the request: the server's clock starts when it arrives
        s.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 5.5.6.6\r\n"
                  b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n--b")
        answer = s.recv(4096)
        waited = time.monotonic() - start
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.I)[1])
        while len(body) < length:  # the body may come in a segment of its own
            body += s.recv(4096)
        answer = (head + b"\r\n\r\n" + body).decode()
    assert answer.startswith("HTTP/1.1 408") and "took over 2 s to arrive" in answer
    assert DEADLINE <= waited < DEADLINE + 5
    assert upload(server, [b"{}"], "5.5.6.6").status_code == 200


def test_a_cut_upload_is_charged_what_arrived_not_what_it_declared():
    """The same in-process: the 408 goes out at the deadline, and the upload's charge of the
    budget falls from the 100,000 bytes it declared to the 3 that came."""
    import asyncio

    async def app(scope, receive, send):  # reads the whole body, as Gradio's upload route does
        while (await receive()).get("more_body"):
            pass

    guard = RequestGuard(app, max_body=10, max_upload=10**6, per_address=4, upload_bytes=10**7,
                         window=60, deadline=0.2)
    messages = [{"type": "http.request", "body": b"--b", "more_body": True}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the rest never comes

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "client": ("5.5.7.7", 1),
             "headers": [(b"content-length", b"100000"),
                         (b"content-type", b"multipart/form-data; boundary=b")]}
    asyncio.run(asyncio.wait_for(guard(scope, receive, send), 5))
    assert sent[0]["status"] == 408  # the 3 bytes it sent stay charged as a tiny upload's disk
    assert [e[1:3] for e in guard.recent] == [[MIN_UPLOAD_CHARGE, "5.5.7.7"]]
    assert guard.charged == MIN_UPLOAD_CHARGE


async def five_byte_request(guard, path: str, address: str) -> tuple[int, str]:
    """One request of a 5-byte multipart body through the guard (a POST to an upload route, else a
    GET): its status, and the refusal's detail ("" when answered 200)."""
    sent, messages = [], [{"type": "http.request", "body": b"--b--", "more_body": False}]

    async def send(message):
        sent.append(message)

    async def receive():
        return messages.pop() if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST" if "upload" in path else "GET", "path": path,
             "client": (address, 1), "headers": [(b"content-length", b"5"),
                                                  (b"content-type", b"multipart/form-data; boundary=b")]}
    await guard(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])["detail"] if sent[0]["status"] != 200 else ""


def test_an_address_holds_a_bounded_number_of_requests_open():
    """One address held 20,000 heartbeats of one session open, every file descriptor the server
    had: other visitors' requests hung. Past max_open at once (its /48 past max_open_network) a
    request is refused; one that ends lets its place go."""
    import asyncio

    release = asyncio.Event()

    async def app(scope, receive, send):  # a heartbeat: answers, then streams until let go
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await release.wait()
        await send({"type": "http.response.body", "body": b""})

    guard = RequestGuard(app, max_body=10, max_upload=100, per_address=2, upload_bytes=10**7, window=10,
                         max_open=3, max_open_network=5)

    async def get(address: str) -> int:
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request", "body": b""}

        scope = {"type": "http", "method": "GET", "path": "/gradio_api/heartbeat/one-session",
                 "client": (address, 1), "headers": []}
        await guard(scope, receive, send)
        return sent[0]["status"]

    async def main():
        v6 = [f"2a01:4f8:1:{i:x}00::1" for i in range(3)]  # three /56s of one /48
        held = [asyncio.create_task(get(a)) for a in ["9.9.9.9"] * 3 + v6[:1] * 2 + v6[1:2] * 3]
        await asyncio.sleep(0.1)
        assert guard.open == {"9.9.9.9": 3, public_address(v6[0]): 2, public_address(v6[1]): 3,
                              "2a01:4f8:1::/48": 5}
        # the address's fourth, and a third /56's first: the /48's sixth (answered while the rest wait)
        refused = [await get("9.9.9.9"), await get(v6[2])]
        private = [asyncio.create_task(get("10.0.0.1")) for _ in range(5)]  # a proxy's: no bound
        await asyncio.sleep(0.1)
        release.set()
        statuses = [await t for t in held]
        assert refused == [429, 429] and statuses == [200] * 8
        assert [await t for t in private] == [200] * 5
        assert guard.open == {} and await get("9.9.9.9") == 200  # their places let go
        # an upload refused for the requests its address holds open is not counted among its
        # uploads (it was, and two such refusals refused the next upload as the address's third)
        release.clear()
        held = [asyncio.create_task(get("9.9.9.9")) for _ in range(3)]  # all its places
        await asyncio.sleep(0.1)
        refused = [await upload("9.9.9.9") for _ in range(3)]
        assert all(r[0] == 429 and r[1].startswith("too many requests open") for r in refused), refused
        assert not guard.by_address and not guard.recent
        release.set()
        assert [await t for t in held] == [200] * 3 and await upload("9.9.9.9") == (200, "")
        assert guard.by_address == {"9.9.9.9": 1}

    async def upload(address: str) -> tuple[int, str]:
        return await five_byte_request(guard, "/gradio_api/upload", address)

    asyncio.run(asyncio.wait_for(main(), 10))


def test_an_event_with_too_much_text_is_refused_before_gradio_keeps_it():
    """Gradio keeps an event's inputs in its page's state for as long as the page lives: five
    cheap events with 1 MB values held 5.5 MiB a page (1.3 GiB from four addresses in 91 s)."""
    from specviz.hooks import scan

    assert scan(["ab", {"k": "cd", "path": "/tmp/x"}, [["e"]], None]) == (False, 2 + 1 + 2 + 4 + 6 + 1)
    # numbers at their digits: Gradio keeps them as it keeps text, and JSON parses 4,300-digit ints
    assert scan([5, True, 0, 1.5, 10**15, -(10**15)]) == (False, 1 + 1 + 1 + 24 + 16 + 16)
    for n in (9, 10, 99, 100, 2**64, 10**300, 10**4299 - 1, -(10**4299)):
        assert scan([n])[1] in (len(str(abs(n))), len(str(abs(n))) + 1), n
    assert scan([10**4299] * 225)[1] > 900_000  # 968 KB of body held 440 KB a page, as 0 characters
    assert scan([{"path": "http://x"}])[0]


def test_an_event_with_too_much_text_is_refused(server):
    r = httpx.post(f"{server.url}/call/fast", json={"data": ["x" * (MAX_CHARS + 1)]}, timeout=10)
    assert r.status_code == 400 and "too much text in one call: at most 5000" in r.json()["detail"]
    assert httpx.post(f"{server.url}/call/fast", json={"data": ["x" * (MAX_CHARS - 10)]},
                      timeout=10).status_code == 200


def test_the_values_of_a_body_are_counted_outside_its_strings():
    from specviz.untrusted import containers

    # outside the strings: [ [ 1 , ] , { : [ 2 ] } ]: three arrays, one object, two separators
    assert containers(b'[[1,"[[[,,{"],{"a\\"[,":[2]}]') == 6
    # a string ending in an escaped backslash: ["\\", [[], []]]: four arrays, two separators
    assert containers(b'["\\\\",[[],[]]]') == 6
    assert containers(("[" + ",".join(["[[]]"] * 1000) + "]").encode()) == 1 + 2000 + 999


def test_an_event_of_many_empty_values_is_refused_before_gradio_parses_it(server):
    """A megabyte of [[]],[[]] holds no text, so the text bound let it by: Gradio took 0.7 s of
    the event loop to parse it and kept ~35 MiB of it in the page's state (2.8 GiB from one
    address's 20 made-up pages in a minute). Counted in the body, it never reaches Gradio."""
    empties = {"data": [[[[]]] * (MAX_VALUES // 2)], "session_hash": "v", "fn_index": server.fast}
    refused = httpx.post(f"{server.url}/queue/join", json=empties, timeout=10)
    assert refused.status_code == 413 and f"at most {MAX_VALUES:,} arrays" in refused.json()["detail"]
    body = json.dumps(empties).encode()  # streamed without a length: counted once whole
    streamed = httpx.post(f"{server.url}/queue/join", headers={"content-type": "application/json"},
                          content=(body[i:i + 256] for i in range(0, len(body), 256)), timeout=10)
    assert streamed.status_code == 413
    # brackets and commas in text are text: a prompt of them passes
    prompt = "[{,}]" * (MAX_CHARS // 5 - 2)
    assert httpx.post(f"{server.url}/call/fast", json={"data": [prompt]}, timeout=10).status_code == 200


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
def test_a_body_in_another_json_encoding_is_refused_before_gradio_parses_it(server, encoding):
    """json.loads reads UTF-16 and UTF-32 too, and there a character such as ∀ (U+2200: bytes
    00 22) holds a quote byte: the value count took the rest for a string, and a 1 MiB body of
    170,000 empty arrays reached Gradio (0.8-1 s of its event loop each, refused or not)."""
    empties = {"data": ["∀", [[]] * (MAX_VALUES // 2)], "session_hash": "v", "fn_index": server.fast}
    body = json.dumps(empties, ensure_ascii=False).encode(encoding)
    refused = httpx.post(f"{server.url}/queue/join", headers={"content-type": "application/json"},
                         content=body, timeout=10)
    assert refused.status_code == 400 and "must be UTF-8 JSON" in refused.json()["detail"]
    small = json.dumps({"data": ["∀ ok"]}, ensure_ascii=False)
    assert httpx.post(f"{server.url}/call/fast", headers={"content-type": "application/json"},
                      content=small.encode(encoding), timeout=10).status_code == 400
    assert httpx.post(f"{server.url}/call/fast", headers={"content-type": "application/json"},
                      content=small.encode("utf-8"), timeout=10).status_code == 200


@pytest.mark.parametrize("peer, forwarded, counted", [
    ("8.8.8.8", ["1.2.3.4"], "8.8.8.8"),  # a public peer is the visitor: its header is its own to write
    ("10.16.3.80", ["9.9.9.9"], "9.9.9.9"),  # a Space's proxy forwarding the visitor
    ("10.16.3.80", ["1.2.3.4, 9.9.9.9"], "9.9.9.9"),  # the visitor wrote 1.2.3.4: the proxy appended 9.9.9.9
    ("10.16.3.80", ["1.2.3.4, 9.9.9.9, 10.0.0.7"], "9.9.9.9"),  # past the proxies between proxies
    ("127.0.0.1", ["1.2.3.4", "9.9.9.9:443"], "9.9.9.9"),  # two header lines are one list; a port
    ("10.16.3.80", ["[2001:4860::8888]:80"], "2001:4860::/56"),  # IPv6: its /56
    ("10.16.3.80", ["2001:0:4136:e378:8000:63bf:aefd:ba5f"], "81.2.69.160"),  # Teredo: its client's IPv4
    ("10.16.3.80", ["2002:5102:45a0:1234::1"], "81.2.69.160"),  # 6to4: the IPv4 whose /48 it is
    ("10.16.3.80", ["81.2.69.160, 192.168.1.50"], None),  # a LAN visitor is itself, not what it wrote
    ("127.0.0.1", ["81.2.69.160, 100.101.1.2"], None),  # so is a CGNAT or Tailscale one
    ("127.0.0.1", ["81.2.69.160, fd00::5"], None),  # and an IPv6 ULA one
    ("10.16.3.80", ["1.2.3.4, garbage"], None),  # not an address: nothing to go on
    ("10.16.3.80", ["10.0.0.1, 10.9.9.9"], None),  # only proxies: no visitor named
    ("10.16.3.80", [], None),  # a proxy that forwards nothing
    ("10.16.3.80", [", ".join(["9.9.9.9"] + ["10.0.0.1"] * 8)], None),  # past FORWARDED_HOPS entries
    ("192.168.1.50", ["9.9.9.9"], None),  # a peer that is no trusted proxy: its header is not read
    (None, ["9.9.9.9"], None),  # no peer: nothing vouches for the header
])
def test_behind_a_trusted_proxy_the_visitor_is_the_first_forwarded_address_that_is_no_proxys(
        peer, forwarded, counted):
    """On a Space the app sees Hugging Face's proxy, a 10.x address, which no per-address limit
    counted: one client could take every place in the line. Reading the forwarded header from
    the right, past trusted proxies only, a visitor cannot choose the address it is counted as."""
    from specviz.gate import proxy_networks, public_address, visitor_address

    proxies = proxy_networks(None, space=True)  # on a Space: its proxy's 10.x trusted too
    assert public_address(visitor_address(peer, forwarded, proxies)) == counted
    assert public_address(visitor_address(peer, forwarded, ())) == public_address(peer)


def test_the_trusted_proxies_come_from_the_environment_with_a_message_naming_the_fix():
    from specviz.gate import PROXIES, SPACE_PROXIES, proxy_networks

    assert [str(n) for n in proxy_networks(None)] == PROXIES.split(",") == ["127.0.0.0/8", "::1/128"]
    assert [str(n) for n in proxy_networks(None, space=True)] == SPACE_PROXIES.split(",") == [
        "127.0.0.0/8", "::1/128", "10.0.0.0/8"]
    assert proxy_networks(" ON ") == proxy_networks("1") == proxy_networks(None) == proxy_networks("  ")
    assert proxy_networks("1", space=True) == proxy_networks(None, space=True)
    assert proxy_networks("0", space=True) == ()
    assert proxy_networks("Off") == proxy_networks("FALSE") == proxy_networks("0") == ()
    assert [str(n) for n in proxy_networks("172.17.0.0/16, 10.1.2.3")] == ["172.17.0.0/16", "10.1.2.3/32"]
    with pytest.raises(ValueError, match="SPECVIZ_TRUST_FORWARDED: .*give 0, 1 or the proxies' networks"):
        proxy_networks("10.0.0.0/8,lots")


async def accepted(scope, receive, send):
    """An app behind the guard that takes every request."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"[]"})


def upload_status(server, peer: str, forwarded: bytes) -> int:
    """The status of an empty upload from peer carrying X-Forwarded-For: forwarded."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "client": (peer, 1),
             "headers": [(b"content-length", b"10"), (b"x-forwarded-for", forwarded)]}
    asyncio.run(server(scope, receive, send))
    return sent[0]["status"]


def test_uploads_behind_a_private_proxy_count_against_the_forwarded_address():
    """The same rule in front of Gradio: one visitor behind a Space's proxy may upload
    per_address traces, another one still may; with trust_forwarded off neither is counted."""
    from specviz.gate import proxy_networks

    proxy = "10.16.3.80"
    for proxies, codes in ((proxy_networks(None, space=True), [200, 200, 429]), ((), [200, 200, 200])):
        guard = RequestGuard(accepted, max_body=10, max_upload=100, per_address=2, upload_bytes=10**6,
                             window=60, proxies=proxies)
        assert [upload_status(guard, proxy, b"1.2.3.4, 9.9.9.9") for _ in range(3)] == codes
        # another visitor (who wrote 9.9.9.9 in vain)
        assert upload_status(guard, proxy, b"9.9.9.9, 8.8.4.4") == 200


def test_a_lan_visitor_behind_a_same_host_proxy_cannot_spend_another_addresss_allowance():
    """Off a Space, behind a same-host nginx, uvicorn (trusting 127.0.0.1) hands the app the
    rightmost forwarded entry as the client: a LAN visitor's 10.1.1.1. With 10.0.0.0/8 trusted as
    proxies by default, the guard read on to the left, where the visitor wrote a victim's public
    address, and spent that address's uploads: the victim was refused. Now 10.0.0.0/8 is trusted
    only on a Space, and the LAN visitor is itself, which no per-address limit counts."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from specviz.gate import proxy_networks

    nginx = "127.0.0.1"
    for proxies, victim in ((proxy_networks(None), 200), (proxy_networks(None, space=True), 429)):
        guard = RequestGuard(accepted, max_body=10, max_upload=100, per_address=2, upload_bytes=10**6,
                             window=60, proxies=proxies)
        server = ProxyHeadersMiddleware(guard, trusted_hosts="127.0.0.1")  # uvicorn's, as Gradio runs it
        # nginx appends the LAN visitor's 10.1.1.1 to what it wrote; then the victim's own upload
        assert [upload_status(server, nginx, b"8.8.4.4, 10.1.1.1") for _ in range(2)] == [200, 200]
        assert upload_status(server, nginx, b"8.8.4.4") == victim  # 429: a Space's trust, off a Space


def test_forwarded_lines_are_read_from_every_form_a_request_carries_them_in():
    from gradio.route_utils import Obj
    from starlette.datastructures import Headers

    from specviz.guard import forwarded

    two = Headers(raw=[(b"x-forwarded-for", b"1.2.3.4"), (b"x-forwarded-for", b"9.9.9.9")])
    assert forwarded(two) == ["1.2.3.4", "9.9.9.9"]  # a live request: every line
    assert forwarded([(b"X-Forwarded-For", b"9.9.9.9")]) == ["9.9.9.9"]  # an ASGI scope's pairs
    assert forwarded({"x-forwarded-for": "9.9.9.9"}) == ["9.9.9.9"]  # a pickled request's dict
    assert forwarded(Obj({"x-forwarded-for": "9.9.9.9"})) == ["9.9.9.9"]  # and its Obj
    assert forwarded({}) == forwarded(Obj({})) == forwarded(None) == []


def test_a_body_longer_than_its_content_length_is_cut_off():
    """Content-Length: 1 with a chunked body of 3 MiB was charged 1 byte against the upload
    budget (of 1 MiB) and written whole: declared lengths are what the budget trusts."""
    written = []

    async def app(scope, receive, send):  # reads the whole body, as Gradio's upload route does
        while True:
            message = await receive()
            written.append(len(message.get("body", b"")))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"[]"})

    guard = RequestGuard(app, max_body=10, max_upload=10**7, per_address=4, upload_bytes=2**20, window=60)
    chunks = [{"type": "http.request", "body": b"x" * 2**20, "more_body": True} for _ in range(3)]
    sent = []

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "client": ("5.5.7.8", 1),
             "headers": [(b"content-length", b"1"), (b"transfer-encoding", b"chunked")]}
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 400 and b"longer than its Content-Length" in sent[1]["body"]
    assert written == [] and guard.charged == 2**20  # it sent 1 MiB before it was cut off


def test_gradio_forgets_pages_closed_or_unused_for_long_and_their_states_go_first():
    """Gradio 6.31 kept every page's state (each output's last value) until 1,000 newer pages
    pushed it out, closed or not: a soak grew the server by 17-21 MiB every 100 jobs, for good."""
    import datetime

    import gradio as gr
    from gradio.state_holder import StateHolder

    from specviz.hooks import forget_pages

    dropped = []
    with gr.Blocks() as blocks:
        key = gr.State(None, delete_callback=dropped.append)
    holder = StateHolder()
    holder.set_blocks(blocks)
    now = datetime.datetime(2026, 12, 5, 12, 0, 0)
    ages = {"live": 30, "quiet": 3601, "closed-recent": 500, "closed-old": 601, "open-away": 7200}
    for page, age in ages.items():  # seconds unused
        holder[page][key._id] = f"trace of {page}"
        holder.time_last_used[page] = now - datetime.timedelta(seconds=age)
    holder.session_data["closed-recent"].is_closed = holder.session_data["closed-old"].is_closed = True
    # "open-away": its heartbeat is connected (a tab left open two hours): it stays
    assert forget_pages(holder, idle=3600, closed=600, now=now, open_pages={"open-away": 1}) == 2
    assert set(holder.session_data) == set(holder.time_last_used) == {"live", "closed-recent", "open-away"}
    assert sorted(dropped) == ["trace of closed-old", "trace of quiet"]  # the shelf's keys let go
    assert forget_pages(object(), 1, 1) == 0  # another Gradio's holder: nothing to do


def test_tidy_runs_once_a_minute_and_removes_only_old_empty_temporary_files_and_folders(tmp_path):
    """Gradio's File (type="filepath") leaves an empty NamedTemporaryFile in its cache for every
    upload and never removes it (280 of them after a soak's 280 uploads); its cache cleaner deletes
    an upload's file and leaves the folder named by its hash."""
    import os
    import time

    from specviz.hooks import Tidy

    old, full, oldhash, newhash = time.time() - 2000, "a" * 64, "b" * 64, "c" * 64
    (tmp_path / full).mkdir()
    (tmp_path / full / "trace.json").write_bytes(b"{}")
    for name in (oldhash, newhash, "X" * 64, "b" * 65, "mine"):
        (tmp_path / name).mkdir()
    os.symlink(tmp_path / newhash, tmp_path / ("d" * 64))
    for name, body, mtime in (("tmpold_1234", b"", old), ("tmpnew_1234", b"", None),
                              ("tmpfull_123", b"x", old), ("upload.json", b"", old), ("tmp.lock", b"", old),
                              ("tmpTOOLONG123", b"", old), ("tmpabcdefgh1", b"", old)):
        (tmp_path / name).write_bytes(body)
        if mtime:
            os.utime(tmp_path / name, (mtime, mtime))
    for name in (full, oldhash, "d" * 64, "X" * 64, "b" * 65, "mine"):
        os.utime(tmp_path / name, (old, old), follow_symlinks=False)
    tidy = Tidy(lambda: None, idle=3600, closed=600, files=1200, cache=str(tmp_path))
    # tmpold_1234 and oldhash go; a folder with a file in it stays, and a link, and what is not
    # named as tempfile names a file or Gradio a folder (should the cache be a folder others use)
    assert tidy() == (0, 2)
    kept = ["X" * 64, full, "b" * 65, newhash, "d" * 64, "mine", "tmp.lock", "tmpTOOLONG123",
            "tmpabcdefgh1", "tmpfull_123", "tmpnew_1234", "upload.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == kept
    os.utime(tmp_path / "tmpnew_1234", (old, old))
    os.utime(tmp_path / newhash, (old, old))
    assert tidy() == (0, 0)  # not a minute since the last: nothing done
    tidy.last -= 61
    assert tidy() == (0, 2) and sorted(p.name for p in tmp_path.iterdir()) == [
        n for n in kept if n not in (newhash, "tmpnew_1234")]


def test_pages_are_forgotten_on_the_event_loop_where_gradio_reads_them():
    """Gradio's expiry task (on the server's loop) checks that a page is there, then reads it: a
    page dropped from a worker thread between the two would end that task for good."""
    import asyncio
    import threading

    import anyio

    from specviz.hooks import _on_loop

    async def main():
        loop = threading.get_ident()
        ran_on = await anyio.to_thread.run_sync(lambda: _on_loop(threading.get_ident))
        return loop, ran_on, threading.get_ident()

    loop, ran_on, _ = asyncio.run(main())
    assert ran_on == loop  # from a worker thread of the loop: on the loop
    assert _on_loop(threading.get_ident) == threading.get_ident()  # no loop: directly


def test_one_value_of_a_closed_page_is_dropped_on_the_loop_and_nothing_else():
    """hooks.drop_value (a page's unload drops the rounds its side plots lag): Gradio keeps a closed
    page's values an hour whatever their time to live. It drops that one value of that one page,
    with nothing of it left behind (its time to live), no delete callback (the value is no shelf
    key), on the server's loop where Gradio's expiry task reads the page's values (a value deleted
    from a worker thread while that task went through them would end it), and says whether it
    was there."""
    import asyncio
    import threading

    import anyio
    import gradio as gr
    from gradio.state_holder import StateHolder

    from specviz.hooks import drop_value

    dropped, deleted_on = [], []

    class Values(dict):
        def __delitem__(self, key):
            deleted_on.append(threading.get_ident())
            super().__delitem__(key)

    with gr.Blocks() as blocks:
        rounds = gr.State(None, time_to_live=60, delete_callback=dropped.append)
        key = gr.State(None, delete_callback=dropped.append)
    holder = StateHolder()
    holder.set_blocks(blocks)
    for page in ("closed", "other"):
        holder[page][rounds._id], holder[page][key._id] = f"rounds of {page}", f"key of {page}"
    closed = holder.session_data["closed"]
    closed.state_data = Values(closed.state_data)

    async def main():
        return threading.get_ident(), await anyio.to_thread.run_sync(
            lambda: drop_value(holder, "closed", rounds._id))

    loop, there = asyncio.run(main())
    assert there and deleted_on == [loop]
    assert dict(closed.state_data) == {key._id: "key of closed"} and rounds._id not in closed._state_ttl
    assert holder.session_data["other"].state_data == {rounds._id: "rounds of other", key._id: "key of other"}
    assert dropped == []
    assert drop_value(holder, "closed", rounds._id) is False  # a second unload: nothing there
    assert drop_value(holder, "never-seen", rounds._id) is False and "never-seen" not in holder.session_data
    assert drop_value(holder, None, rounds._id) is False
    assert drop_value(object(), "other", rounds._id) is False  # another Gradio's holder
    assert drop_value(holder, "other", key._id) is True and dropped == []


def test_tidy_removes_folders_on_the_event_loop_where_gradio_fills_them(tmp_path, monkeypatch):
    """Gradio makes an upload's folder and moves the file in on the server's loop, with no await
    between: a folder removed from a worker thread could go between the two and fail the upload."""
    import asyncio
    import os
    import threading
    import time

    import anyio

    from specviz import hooks

    old = time.time() - 2000
    emptied = tmp_path / ("e" * 64)
    emptied.mkdir()
    os.utime(emptied, (old, old))
    removed_on, rmdir = [], os.rmdir
    monkeypatch.setattr(hooks.os, "rmdir", lambda p: (removed_on.append(threading.get_ident()), rmdir(p)))
    tidy = hooks.Tidy(lambda: None, idle=3600, closed=600, files=1200, cache=str(tmp_path))

    async def main():
        return threading.get_ident(), await anyio.to_thread.run_sync(tidy)

    loop, done = asyncio.run(main())
    assert done == (0, 1) and removed_on == [loop] and not emptied.exists()
    emptied.mkdir()
    os.utime(emptied, (old, old))
    tidy.last -= 61

    def closed(fn):
        raise RuntimeError("Event loop is closed")

    monkeypatch.setattr(hooks, "_on_loop", closed)
    assert tidy() == (0, 0) and emptied.exists()  # a server shutting down: the sweep waits, no error


def test_a_refused_upload_gives_its_open_request_place_back():
    """An upload refused for the address's upload count kept its place among the address's open
    requests: three such refusals locked the address (and everyone behind its NAT) out of every
    route for the life of the process."""
    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = RequestGuard(app, max_body=10, max_upload=100, per_address=1, upload_bytes=10**7, window=600,
                         max_open=3)
    def status(path: str) -> int:
        return asyncio.run(five_byte_request(guard, path, "9.9.9.9"))[0]

    assert [status("/gradio_api/upload") for _ in range(5)] == [200] + [429] * 4
    assert status("/") == 200 and not guard.open


def test_pages_per_address_forget_idle_addresses():
    """Every address that ever called was remembered: one cycling through IPv6 /56s grew the table
    for good. Every 1,024th call drops the addresses idle a whole window."""
    pages = PerAddress(per_address=1, window=10)
    for i in range(5000):
        pages.refuse(f"8.{i // 256 % 256}.{i % 256}.1", f"s{i}", 0)
    for j in range(2048):
        pages.refuse("9.9.9.9", "one", 100 + j)  # every earlier address idle for ten windows
    assert len(pages.seen) <= 2


def fake_queue():
    """A stand-in for Gradio's queue with one event line, "run": push records an unread event."""
    fn = SimpleNamespace(concurrency_id="run", fn=print, inputs=[None], preprocess=False)  # one input
    lane = SimpleNamespace(queue=[])
    queue = SimpleNamespace(blocks=SimpleNamespace(fns={0: fn}), event_queue_per_concurrency_id={"run": lane},
                            active_jobs=[], pending_event_ids_session={}, pending_messages_per_session={},
                            max_size=None)
    ids = iter(range(10**6))

    async def push(body, request, username):
        i = f"e{next(ids)}"
        queue.pending_event_ids_session.setdefault(body.session_hash, set()).add(i)
        lane.queue.append(SimpleNamespace(concurrency_id="run", _id=i, session_hash=body.session_hash))
        return True, i, "success"

    async def clean(**_):
        pass

    queue.push, queue.clean_events = push, clean
    return queue


def pushed(queue, hosts_and_sessions) -> int:
    async def run():
        ok = 0
        for host, session in hosts_and_sessions:
            request = SimpleNamespace(client=SimpleNamespace(host=host), headers={})
            ok += (await queue.push(SimpleNamespace(fn_index=0, session_hash=session, data=["x"]), request,
                                    None))[0]
        return ok
    return asyncio.run(run())


def test_a_line_holds_per_line_events_and_one_ipv6_48_a_quarter_of_it():
    queue = fake_queue()
    cap_queue(queue, per_line=6, per_address=3)
    assert pushed(queue, [(f"8.8.{i}.8", f"s{i}") for i in range(20)]) == 6  # 20 addresses, 6 places
    # the app's line (128 places, 16 an address): 256 /56s of one /48, four events each, hold 32
    queue = fake_queue()
    cap_queue(queue, per_line=128, per_address=16)
    one_48 = [(f"2a01:4f8:1:{i:x}00::1", f"s{i}-{j}") for i in range(256) for j in range(4)]
    assert pushed(queue, one_48) == 32


def test_behind_a_trusted_proxy_the_queue_counts_each_forwarded_visitor():
    """Behind the operator's proxy (SPECVIZ_TRUST_FORWARDED) every event arrives from the proxy's
    address: the queue counts the visitor the proxy names, so one visitor's events are bounded
    and another's behind the same proxy are not refused for them; a forwarded line from a peer
    that is no trusted proxy names nobody."""
    from specviz.gate import proxy_networks

    def pushes(queue, sent):
        async def run():
            done = []
            for i, (peer, visitor) in enumerate(sent):
                request = SimpleNamespace(client=SimpleNamespace(host=peer),
                                          headers={"x-forwarded-for": visitor})
                body = SimpleNamespace(fn_index=0, session_hash=f"s{i}", data=["x"])
                done.append((await queue.push(body, request, None))[0])
            return done
        return asyncio.run(run())

    queue = fake_queue()
    cap_queue(queue, per_line=6, per_address=1, proxies=proxy_networks("10.0.0.0/8"))
    proxy = "10.16.3.80"  # the operator's proxy, on a private network SPECVIZ_TRUST_FORWARDED names
    assert pushes(queue, [(proxy, "1.2.3.4"), (proxy, "1.2.3.4"), (proxy, "5.6.7.8")]) == [True, False, True]
    queue = fake_queue()
    cap_queue(queue, per_line=6, per_address=1, proxies=proxy_networks("10.0.0.0/8"))
    assert pushes(queue, [("8.8.8.8", "1.2.3.4"), ("8.8.8.8", "5.6.7.8")]) == [True, False]  # 8.8.8.8's own


def test_a_page_closed_during_its_run_drops_the_views_queued_for_it():
    """Gradio's clean_events marks a running event's page gone but keeps the messages already
    queued for it: 1 MB views of a closed tab stayed in memory for good."""
    async def run():
        messages = asyncio.Queue()
        for _ in range(3):
            messages.put_nowait(SimpleNamespace(event_id="e1", data="x" * 10**6))
        queue = fake_queue()
        queue.active_jobs = [[SimpleNamespace(_id="e1", session_hash="page", concurrency_id="run")]]
        queue.pending_event_ids_session = {"page": {"e1"}}
        queue.pending_messages_per_session = {"page": messages}
        cap_queue(queue, per_line=6, per_address=3)
        await queue.clean_events(session_hash="page")
        return messages.qsize()
    assert asyncio.run(run()) == 0


def test_a_pages_state_value_is_the_servers_and_unknown_wherever_it_cannot_be_read():
    """page_value reads a page's State value as the server holds it now (None too: a value the
    page holds), and gives `unknown` (None unless named) where there is nothing to read: no such
    value, no such page, no session, no holder, or a Gradio that keeps its pages otherwise."""
    from specviz.hooks import page_value

    unknown = object()
    holder = SimpleNamespace(session_data={"page": SimpleNamespace(state_data={7: "sides", 8: None})})
    assert page_value(holder, "page", 7, unknown) == "sides"
    assert page_value(holder, "page", 8, unknown) is None
    other_gradio = SimpleNamespace(session_data={"page": SimpleNamespace(state_data=[])})
    for where, session, key in ((holder, "page", 9), (holder, "other", 7), (holder, None, 7),
                                (None, "page", 7), (SimpleNamespace(), "page", 7), (other_gradio, "page", 7)):
        assert page_value(where, session, key, unknown) is unknown, (where, session, key)
    assert page_value(holder, "page", 9) is None
