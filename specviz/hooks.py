"""What reaches into Gradio's (and uvicorn's) own objects, where one client could otherwise take
what all share; the ASGI middleware in front of every request is guard.RequestGuard. Three
reviews played a hostile client against the app; docs/load-test.md has what each attack did
before and after.

- `cap_queue` wraps Gradio's queue, whose one bound over every line one client could fill:
  each line (concurrency id) gets its own bound; a public address may have a few events
  waiting or unread, and use a few pages (sessions) an hour; an event may not name a file by
  URL (Gradio would download it), nor carry more text than a few prompts (Gradio keeps inputs
  in the page's state).
- `forbid_downloads` turns Gradio's downloader into a refusal.
- `allow_long_heads` lets uvicorn read a request head as long as the longest query the guard admits.
- `forget_pages` and `Tidy` drop what Gradio keeps of pages that are gone: their state (a copy of
  every output's last value), the empty file each upload leaves in its cache, and the folders
  Gradio's cache cleaner empties; `keep_closed_page`, `drop_value` and `page_value` keep, drop
  and read a page's state.

Addresses count as gate.public_address says: a private one (a proxy's) is not counted.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from collections import defaultdict

from specviz.gate import network_of, public_address
from specviz.guard import LONG_SESSION, MAX_SESSION, MAX_URL, PerAddress, request_address

QUEUE_FULL = ("queue full: {what} already has {n} events waiting or unread; wait for them to "
              "finish and read their results (the page does), then try again")
LINKED = ("files must be uploaded, not linked: upload the file first (the page does; "
          "gradio_client's handle_file with a local path does too)")
TOO_MUCH_TEXT = ("too much text in one call: at most {n} characters in all (a prompt, and the settings; "
                 "a number counts its digits)")
NO_SUCH_EVENT = "no such event in this app: call one the page offers (see 'Use via API')"
BROWSER_ONLY = "this event runs in the browser only: call one the page offers (see 'Use via API')"
TOO_FEW = "this event takes {n} values in 'data', got {got}: send one for each of its inputs"
NOT_UPLOADED = ("a file input takes the data of a file uploaded to this server: upload it first "
                "(POST /gradio_api/upload; the page and gradio_client do)")
UNREAD_SECONDS = 900.0  # a finished result unread this long is dropped from server memory
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a scheme: http:, https:, data:, file: ...
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")  # C:\... is a path, not a scheme


def scan(data) -> tuple[bool, int]:
    """Whether event data names a file by URL ({"path": "https://..."} anywhere inside), and how
    many characters it holds: text (keys and values) and numbers, each at its digits (an int at
    most 4,300, which JSON parses; Gradio keeps them as it keeps text: 225 such ints in one event
    held 440 KB where text was capped at 32 K characters)."""
    stack, linked, chars = [data], False, 0
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, int):  # bools too: 1 digit
            chars += 1 + value.bit_length() * 30103 // 100000  # its decimal digits, within one
        elif isinstance(value, float):
            chars += 24  # the longest repr of a float: -2.2250738585072014e-308
        elif isinstance(value, dict):
            path = value.get("path")
            linked |= isinstance(path, str) and bool(_URL.match(path)) and not _WINDOWS.match(path)
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return linked, chars


def cap_queue(queue, per_line: int, per_address: int, pages: PerAddress | None = None,
              max_chars: int | None = None, proxies: tuple = ()) -> None:
    """Wrap a Gradio Queue's push. An event is refused ("queue_full", HTTP 503, with a message
    that names the fix) when its line already has per_line events waiting; when its client's
    public address has per_address events waiting or unread (a result stays in server memory
    until the client reads it: results never read were a way to fill it); or when the address
    has used all its `pages`; or when its IPv6 /48 (gate.network_of: one free tunnel /48 is 256
    addresses of their own) has per_network, a quarter of a line, as the Gate's.
    Gradio's own bound then never binds first. An event whose data
    names a file by URL is refused (HTTP 400): Gradio would download it; and so is one holding
    more than max_chars characters of text: Gradio keeps an event's inputs in its page's state,
    which lives as long as the page (1 MB values in five cheap events held 5.5 MiB a page).
    Also refused: an event this app does not have, and a session hash over MAX_SESSION characters
    (Gradio keeps a state for each). An unread result stops counting once its page's data stream
    has disconnected (Gradio then keeps nothing more of it), or UNREAD_SECONDS after it was first
    seen finished: then its messages are dropped, which Gradio never does for a client that calls
    and never reads (a run's views, tens of MiB, were kept for good: 16 more every 15 minutes)."""
    push, clean = queue.push, queue.clean_events
    joining: defaultdict[tuple, int] = defaultdict(int)  # pushes under way, by line and address
    unread: dict[str, tuple] = {}  # event id -> (public address or None, session), until read
    finished: dict[str, float] = {}  # unread event id -> when first seen finished
    per_network = max(per_address, per_line // 4)

    def waiting(line: str) -> int:
        return sum(count for (ln, _), count in joining.items() if ln == line) + sum(
            1 for lane in queue.event_queue_per_concurrency_id.values() for event in lane.queue
            if event.concurrency_id == line)

    def live():
        """The events waiting in a line or running."""
        for lane in queue.event_queue_per_concurrency_id.values():
            yield from lane.queue
        for jobs in queue.active_jobs:
            yield from jobs or ()

    def drop_messages(session: str | None, ids: set[str]) -> None:
        """The messages these events queued for a session, gone (no await: atomic)."""
        messages = queue.pending_messages_per_session.get(session) if session else None
        if messages is not None:
            kept = [m for m in (messages.get_nowait() for _ in range(messages.qsize()))
                    if getattr(m, "event_id", None) not in ids]
            for m in kept:
                messages.put_nowait(m)

    def held(mine) -> int:
        """Events waiting, running or unread of the public addresses `mine` says True of."""
        return (sum(count for (_, a), count in joining.items() if mine(a))
                + sum(1 for a, _ in unread.values() if mine(a)))

    def forget() -> None:
        pending = set().union(*queue.pending_event_ids_session.values())
        running, now = {e._id for e in live()}, time.monotonic()
        for event_id, (_, session) in list(unread.items()):
            if event_id not in pending:  # read, or cleaned with its page
                del unread[event_id]
                finished.pop(event_id, None)
            elif event_id not in running and now - finished.setdefault(event_id, now) > UNREAD_SECONDS:
                drop_messages(session, {event_id})  # finished and never read: nobody will
                ids = queue.pending_event_ids_session.get(session)
                if ids is not None:
                    ids.discard(event_id)
                    if not ids:
                        del queue.pending_event_ids_session[session]
                del unread[event_id], finished[event_id]

    async def cleaned(*, session_hash: str | None = None, event_id: str | None = None) -> None:
        """Gradio cleans a page's events when its data stream disconnects (a closed tab): what
        was waiting or running then is never sent, yet Gradio keeps a running one's id pending
        for good, so an address whose visitors closed 16 tabs mid-run was refused every event
        from then on. Those events are forgotten here, with the messages they had queued for the
        page; results that had finished stay counted until read (their messages stay too)."""
        def mine(event) -> bool:  # as Gradio's clean_events matches them
            return event.session_hash == session_hash or event._id == event_id

        doomed = {e._id for e in live() if mine(e)}
        await clean(session_hash=session_hash, event_id=event_id)
        for e in doomed:
            unread.pop(e, None)
        if doomed:  # no page will read them
            drop_messages(session_hash, doomed)

    async def capped_push(body, request, username):
        fn = queue.blocks.fns.get(body.fn_index) if isinstance(body.fn_index, int) else None
        if fn is None:  # Gradio made the page's state before it found no such event
            return False, NO_SUCH_EVENT, "error"
        # Gradio failed each of these in the worker with a traceback in the log (0.9-2.1 KB a call)
        if fn.fn is None:  # a step of the page's own script (Stop's first click, copy link)
            return False, BROWSER_ONLY, "error"
        if isinstance(body.data, list) and len(body.data) < len(fn.inputs):
            return False, TOO_FEW.format(n=len(fn.inputs), got=len(body.data)), "error"
        if fn.preprocess and isinstance(body.data, list) and not_uploaded(fn.inputs, body.data):
            return False, NOT_UPLOADED, "error"
        if isinstance(body.session_hash, str) and len(body.session_hash) > MAX_SESSION:
            return False, LONG_SESSION, "error"
        linked, chars = scan(body.data)
        if linked:
            return False, LINKED, "error"
        if max_chars is not None and chars > max_chars:
            return False, TOO_MUCH_TEXT.format(n=max_chars), "error"
        line, address = fn.concurrency_id, public_address(request_address(request, proxies))
        forget()  # the results read since, and those unread for long
        if waiting(line) >= per_line:
            return False, QUEUE_FULL.format(what="this line", n=per_line), "queue_full"
        if address is not None and held(lambda a: a == address) >= per_address:
            return False, QUEUE_FULL.format(what="your address", n=per_address), "queue_full"
        network = network_of(address)
        if network is not None and held(lambda a: network_of(a) == network) >= per_network:
            return False, QUEUE_FULL.format(what=f"your network ({network})", n=per_network), "queue_full"
        if address is not None and pages and (why := pages.refuse(address, body.session_hash,
                                                                  time.monotonic())):
            return False, why, "queue_full"
        joining[line, address] += 1
        try:
            ok, event_id, state = await push(body, request, username)
        finally:
            joining[line, address] -= 1
            if not joining[line, address]:
                del joining[line, address]
        if ok:  # counted against a public address; dropped unread after UNREAD_SECONDS, any address's
            unread[event_id] = (address, body.session_hash)
        return ok, event_id, state

    queue.push, queue.clean_events = capped_push, cleaned
    lines = {fn.concurrency_id for fn in queue.blocks.fns.values()}
    queue.max_size = per_line * max(1, len(lines))


def not_uploaded(inputs: list, data: list) -> bool:
    """Whether a single File input's value is anything but nothing or the data of a file in
    Gradio's upload folder: Gradio's preprocessing failed on any other (a path never uploaded, a
    string, a list) with a traceback in the log, 1.4-1.8 KB each."""
    from gradio import components, utils

    for component, value in zip(inputs, data, strict=False):
        if not isinstance(component, components.File) or component.file_count != "single" or value is None:
            continue
        path = value.get("path") if isinstance(value, dict) else None
        if not isinstance(path, str) or "\0" in path:
            return True
        try:  # a name too long, a lone surrogate: no file here either
            full = utils.abspath(path)
            if not utils.is_in_or_equal(full, utils.get_upload_folder()) or not full.is_file():
                return True
        except (OSError, ValueError):
            return True
    return False


def calls_of(fns: dict) -> dict:
    """{api name or fn_index: the values a call outside the queue needs} of a Blocks' events
    (RequestGuard's `calls`): what a body posted to `/call/`, `/run/` or `/api/` may name, private
    events included (the page's examples load through `/run/load_example`). 0 for an event of the
    queue: Gradio refuses it outside the queue itself (404, quietly), and cap_queue checks it in.
    Not an event that runs in the browser only (no Python behind it: Gradio failed it with a
    traceback; the page never sends one, its config marks them)."""
    return {key: 0 if fn.queue else len(fn.inputs) for index, fn in fns.items() if fn.fn is not None
            for key in (index, *([fn.api_name] if fn.api_name else []))}


def stream_known(queue, session: str | None, event: str | None) -> bool:
    """Whether Gradio's queue holds results for a page's stream (session) or an API call's
    (event), as its routes find them: an event's session, else the session whose pending events
    name it, else the event id itself. Its stream of an unknown one raised a 404 after it had
    started: a 5.7 KB traceback in the log per request."""
    if event is not None:
        known = queue.event_ids_to_events.get(event)
        session = known.session_hash if known is not None else next(
            (s for s, ids in list(queue.pending_event_ids_session.items()) if event in ids), event)
    return session in queue.pending_messages_per_session


def forget_pages(holder, idle: float, closed: float, now: datetime.datetime | None = None,
                 open_pages=()) -> int:
    """Drop the state of pages unused for `idle` seconds, or closed and unused for `closed`, from
    Gradio's StateHolder; returns how many. A page in `open_pages` (its heartbeat stream is
    connected: it is open in a browser, however long its visitor is away) stays. Gradio 6.31
    keeps each page's state (a copy of every output's last value: 0.3-1 MiB after a run) until
    state_session_capacity newer pages push it out, closed or not: a soak of 2,000 jobs grew the
    server by 17-21 MiB every 100, for good, and a quiet Space held its last 1,000 visitors' pages
    for days. A page's State values go through Gradio's own deletion first (their delete
    callbacks: the shelf's trace keys). A page that comes back after that starts from the
    defaults, and the app tells it its run went (app.FORGOTTEN)."""
    data, used, lock = (getattr(holder, name, None) for name in ("session_data", "time_last_used", "lock"))
    if data is None or used is None or lock is None:  # another Gradio: nothing to do
        return 0
    now = now or datetime.datetime.now()  # Gradio's clock for time_last_used
    with lock:
        try:
            pages = list(data.items())
        except RuntimeError:  # a page made meanwhile (Gradio adds pages without the lock): next time
            return 0
    gone = {}
    for page, state in pages:
        if page in open_pages:  # open in a browser: its visitor may come back to it any time
            continue
        last = used.get(page)
        age = (now - last).total_seconds() if last is not None else 0.0
        if age > idle or (getattr(state, "is_closed", False) and age > closed):
            gone[page] = last
    forgotten = 0
    for page, last in gone.items():
        with lock:
            if used.get(page) != last:  # used meanwhile: it stays
                continue
            holder.delete_state(page)
            data.pop(page, None)
            used.pop(page, None)
            forgotten += 1
    return forgotten


def keep_closed_page(holder, session: str | None) -> None:
    """A closed page still in use keeps its state as long as it is used. Gradio 6.31 deletes each
    State value of a page it marked closed (its heartbeat ended) an hour after the value was set
    (SessionState.STATE_TTL_WHEN_CLOSED), however recently the page was used; a page whose
    connection dropped while it stayed open (a laptop's sleep, a network change) never opens its
    heartbeat again, so a visitor using it lost the run it shows an hour after that run. Each use
    moves the hour on, as if every value had been set now. Tidy still lets the page go once it has
    been unused for its `closed` seconds."""
    data = getattr(holder, "session_data", None)
    state = data.get(session) if data is not None and session is not None else None
    ttl = getattr(state, "_state_ttl", None)
    if not getattr(state, "is_closed", False) or not isinstance(ttl, dict):  # open, or another Gradio
        return
    now = datetime.datetime.now()  # Gradio's clock for the values' ages
    for key, (live, _) in list(ttl.items()):
        ttl[key] = (live, now)


def drop_value(holder, session: str | None, key: int) -> bool:
    """Drop one State value (its block's _id: key) of a page from Gradio's StateHolder, on the
    server's loop (_on_loop), without its delete callback; whether it was there. Gradio 6.31 keeps
    each value of a page it marked closed an hour (SessionState.STATE_TTL_WHEN_CLOSED), whatever
    the State's own time_to_live."""
    data = getattr(holder, "session_data", None)
    if data is None or session is None:  # not launched, or another Gradio
        return False

    def drop() -> bool:
        values = getattr(data.get(session), "state_data", None)
        if not isinstance(values, dict) or key not in values:
            return False
        del values[key]
        getattr(data[session], "_state_ttl", {}).pop(key, None)
        return True

    return _on_loop(drop)


def page_value(holder, session: str | None, key: int, unknown=None):
    """A page's State value (its block's _id: key) as the server holds it now, or `unknown` where
    it cannot be read (not launched, another Gradio, no such page or value). Gradio sets it on the
    server's loop as it takes each output of an event's function; one dict read from a worker
    thread needs no lock."""
    data = getattr(holder, "session_data", None)
    page = data.get(session) if data is not None and session is not None else None
    values = getattr(page, "state_data", None)
    return values.get(key, unknown) if isinstance(values, dict) else unknown


def _on_loop(fn):
    """fn() on the server's event loop, where Gradio reads and changes its pages (its expiry task
    checks that a page is there, then reads it: a page dropped from a worker thread between the
    two would end that task for good); run directly where the caller is no worker thread of the
    loop's (a test's direct call)."""
    from anyio.from_thread import run_sync

    try:
        return run_sync(fn)
    except RuntimeError as e:
        if "worker thread" not in str(e):
            raise
        return fn()


HASH_NAME = re.compile(r"[0-9a-f]{64}")  # a folder of Gradio's cache: its content's sha256
TEMP_NAME = re.compile(r"tmp[a-z0-9_]{8}")  # a NamedTemporaryFile's name (tempfile's default)


class Tidy:
    """At most once every `every` seconds (whoever calls first does it): forget_pages, and in
    Gradio's cache's top folder `cache`, what is older than `files` seconds of what Gradio leaves
    there: the empty file its File component (type="filepath") makes for each upload and forgets
    (a NamedTemporaryFile), and the empty folders its cleaner leaves (an upload or a saved file
    goes into a folder named by its content's sha256; the cleaner deletes the file, not the folder;
    only files and folders so named go, should the cache be a folder others use too).
    The sweep runs on the server's event loop, where Gradio makes an upload's (or a saved file's)
    folder and moves (copies) the file in with no await between, so none of this server's finds
    its folder gone. (Gradio copies in a thread only where that move fails, and it does not: the
    upload's temporary file is in the same folder.) Another Gradio process using the same cache
    folder (the default, /tmp/gradio, is every one's on the host) has no such guarantee: give
    each app its own GRADIO_TEMP_DIR."""

    def __init__(self, holder_of, idle: float, closed: float, files: float, cache: str | None = None,
                 every: float = 60.0, open_pages=()):
        self.holder_of, self.idle, self.closed, self.files, self.every = holder_of, idle, closed, files, every
        self.open_pages = open_pages  # sessions whose heartbeat is connected (guard.RequestGuard.beating)
        self.cache, self.lock, self.last = cache, threading.Lock(), -float("inf")

    def __call__(self) -> tuple[int, int]:
        """(pages forgotten, files and folders removed); (0, 0) where it is not yet time."""
        if not self.lock.acquire(blocking=False):
            return 0, 0
        try:
            now = time.monotonic()
            if now - self.last < self.every:
                return 0, 0
            self.last = now
            holder = self.holder_of()
            pages = 0 if holder is None else _on_loop(lambda: forget_pages(holder, self.idle, self.closed,
                                                                        open_pages=self.open_pages))
            try:
                removed = _on_loop(self._sweep)
            except RuntimeError:  # no loop to run it on (a server shutting down): folders next time
                removed = self._sweep(folders=False)
            return pages, removed
        finally:
            self.lock.release()

    def _sweep(self, folders: bool = True) -> int:
        """Remove the cache's old empty tempfile-named files and, with folders, its old empty
        sha256-named folders, in one pass over the folder: how many went."""
        removed, now = 0, time.time()
        try:
            entries = list(os.scandir(self.cache)) if self.cache else []
        except OSError:
            return 0
        for entry in entries:
            try:
                if TEMP_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    stat = entry.stat()
                    if stat.st_size == 0 and now - stat.st_mtime > self.files:
                        os.unlink(entry.path)
                        removed += 1
                elif (folders and HASH_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)
                      and now - entry.stat().st_mtime > self.files):
                    os.rmdir(entry.path)  # refuses a folder that is not empty
                    removed += 1
            except OSError:  # not empty, or gone meanwhile
                continue
        return removed


def forbid_downloads() -> None:
    """Make Gradio refuse to download any URL into its cache (a file input given as a URL, in
    an event or swapped into one): this app only ever takes uploaded files. Process-wide."""
    from gradio import processing_utils

    def refuse(url, *args, **kwargs):
        raise ValueError(LINKED)

    async def refuse_async(url, *args, **kwargs):
        raise ValueError(LINKED)

    processing_utils.async_ssrf_protected_download = refuse_async
    processing_utils.ssrf_protected_download = processing_utils.save_url_to_cache = refuse


HEAD_ROOM = 16 * 2**10  # a request head's method, path and headers, besides its query (h11's own bound)


def allow_long_heads(max_query: int) -> None:
    """uvicorn's h11 server refused (400, "Invalid HTTP request received") a request whose head was
    still incomplete past h11's 16 KiB: over a network a share link of a long prompt (a query of up
    to guard.RequestGuard's max_page_query) arrives in pieces, and was refused though the guard admits it
    (on loopback it usually came in one piece and passed). Heads may now reach the longest query and
    HEAD_ROOM: still bounded. Gradio makes uvicorn's Config itself, so this sets the bound its h11
    protocol falls back on. Process-wide; httptools, where installed, reads heads of any length."""
    from uvicorn.protocols.http import h11_impl

    h11_impl.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE = max(h11_impl.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE,
                                                     max_query + MAX_URL + HEAD_ROOM)
