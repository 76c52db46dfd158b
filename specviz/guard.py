"""Bounds in front of Gradio's own machinery, where one client could otherwise take what all
share. Three reviews played a hostile client against the app; docs/load-test.md has what each
attack did before and after.

- `cap_queue` wraps Gradio's queue, whose one bound over every line one client could fill:
  each line (concurrency id) gets its own bound; a public address may have a few events
  waiting or unread, and use a few pages (sessions) an hour; an event may not name a file by
  URL (Gradio would download it), nor carry more text than a few prompts (Gradio keeps inputs
  in the page's state).
- `RequestGuard` (ASGI middleware) bounds every request's body in size and time, an upload to
  one file, an address's uploads and all uploads over the time a file stays on disk; and it
  refuses routes that fetch URLs, feed running events, or that the app does not use.
- `forbid_downloads` turns Gradio's downloader into a refusal.
- `allow_long_heads` lets uvicorn read a request head as long as the longest query the guard admits.
- `forget_pages` and `Tidy` drop what Gradio keeps of pages that are gone: their state (a copy of
  every output's last value), the empty file each upload leaves in its cache, and the folders
  Gradio's cache cleaner empties.

Addresses count as gate.public_address says: a private one (a proxy's) is not counted.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import threading
import time
from collections import Counter, OrderedDict, defaultdict, deque
from urllib.parse import parse_qsl, urlencode

from specviz.gate import network_of, public_address, visitor_address
from specviz.untrusted import containers, is_utf8_json

QUEUE_FULL = ("queue full: {what} already has {n} events waiting or unread; wait for them to "
              "finish and read their results (the page does), then try again")
LINKED = ("files must be uploaded, not linked: upload the file first (the page does; "
          "gradio_client's handle_file with a local path does too)")
TOO_MUCH_TEXT = "too much text in one call: at most {n} characters in all (a prompt, and the settings)"
TOO_MANY_PAGES = ("too many pages from your address: {n} in {minutes} minutes; go on in a page "
                  "you have open (calls through gradio_client keep one session)")
UPLOAD_PATH = "/gradio_api/upload"
STREAM_PATH = "/gradio_api/stream/"
_CLOSED = re.compile(  # Gradio routes this app does not use
    r"(/gradio_api/(deep_link|component_server|dev/reload|runs|run-history|process_recording"
    r"|vibe-edit|undo-vibe-edit|vibe-code)|^/monitoring)(/|$)")
# The page asks for an upload's progress on every upload; Gradio's stream of it is closed (its
# tracker kept an entry for each id for good, and each stream polled it every 50 ms), and a 404
# there was two errors in the visitor's console on every trace opened: it is told at once that
# the upload is done (the page then closes the stream; the upload's own answer says the rest)
_UPLOAD_PROGRESS = re.compile(r"/gradio_api/upload_progress/?$")
UPLOAD_DONE = b'data: {"msg": "done"}\n\n'
_HEARTBEAT = re.compile(r"/gradio_api/heartbeat/([^/]+)/?$")
_FETCH = re.compile(r"/gradio_api/(file=|file/|proxy=)[A-Za-z][A-Za-z0-9+.-]*:")  # ...=https://
MIN_UPLOAD_CHARGE = 16 * 2**10  # what a tiny upload costs on disk: Gradio's folder for it and the file
TOO_LARGE = "request too large: at most {mib:.1f} MiB a request{what}"
TOO_MANY_VALUES = ("too many values in one request: at most {n:,} arrays, objects and separators "
                   "(a call of this app needs a few dozen)")
MAX_SESSION = 64  # characters of a session hash (Gradio's page makes 11, gradio_client 36)
LONG_SESSION = (f"a session hash is at most {MAX_SESSION} characters (the page and gradio_client make "
                "shorter ones)")
NO_SUCH_EVENT = "no such event in this app: call one the page offers (see 'Use via API')"
NOT_UTF8 = "a request's body must be UTF-8 JSON (as the page and gradio_client send it)"
UNREAD_SECONDS = 900.0  # a finished result unread this long is dropped from server memory
MAX_URL = 4096  # bytes of a request's path, and of its query string
_PAGE_QUERY = re.compile(r"/gradio_api/queue/(join|data)/?$")  # the page's query string appended
_CALL = re.compile(r"/gradio_api/(call|run|api)/[^/]+/?$")  # each makes the body's session's page
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a scheme: http:, https:, data:, file: ...
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")  # C:\... is a path, not a scheme


def scan(data) -> tuple[bool, int]:
    """Whether event data names a file by URL ({"path": "https://..."} anywhere inside), and how
    many characters of text it holds (keys and values)."""
    stack, linked, chars = [data], False, 0
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            path = value.get("path")
            linked |= isinstance(path, str) and bool(_URL.match(path)) and not _WINDOWS.match(path)
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return linked, chars


def forwarded(headers) -> list[str]:
    """A request's X-Forwarded-For lines: Starlette's headers, ASGI's [(name, value)] pairs, or a
    mapping (a dict, or Gradio's Obj of a pickled request, which keep the first line only)."""
    if isinstance(headers, list):  # an ASGI scope's pairs, in bytes
        return [v.decode("latin-1") for k, v in headers if k.lower() == b"x-forwarded-for"]
    if hasattr(headers, "getlist"):
        return headers.getlist("x-forwarded-for")
    try:
        value = headers["x-forwarded-for"] if "x-forwarded-for" in headers else None
    except (TypeError, KeyError):
        value = None
    return [value] if isinstance(value, str) else []


def request_address(request, proxies: tuple = ()) -> str | None:
    """The address that stands for a request's visitor (gate.visitor_address): the peer's, or
    behind a trusted proxy the entry it forwarded."""
    client = getattr(request, "client", None) if request is not None else None
    host = getattr(client, "host", None)
    return visitor_address(host if isinstance(host, str) else None,
                           forwarded(getattr(request, "headers", None) or {}), proxies)


class PerAddress:
    """The distinct keys each public address has used in the last `window` seconds, at most
    per_address, and each IPv6 /48 (gate.network_of: one free tunnel /48 is 256 /56s, each an
    address of its own) at most per_network (by default four addresses' worth); a key of None is
    new each time. For sessions (pages): Gradio keeps state for a bounded number of them and drops
    the least recently used, so a client making up sessions would expire every other visitor's
    page, and a call without a session gets a fresh one. refused: the message for a refused key,
    with {n} and {minutes} to fill in."""

    def __init__(self, per_address: int, window: float, refused: str = TOO_MANY_PAGES,
                 per_network: int | None = None):
        self.per_address, self.window, self.refused = per_address, window, refused
        self.per_network = 4 * per_address if per_network is None else per_network
        self.seen: dict[str, OrderedDict] = {}  # address (or network) -> key -> last use
        self.calls = 0

    def _message(self, n: int, network: str | None = None) -> str:
        """The refusal of a key past a bound of n: its address's, or its network's."""
        text = self.refused.format(n=n, minutes=round(self.window / 60))
        return text if network is None else text.replace("your address", f"your network ({network})", 1)

    def _recent(self, owner: str, now: float) -> OrderedDict:
        """owner's keys of the last window (an address's sessions, a network's (address, session)
        pairs), oldest use first."""
        mine = self.seen.setdefault(owner, OrderedDict())
        while mine and next(iter(mine.values())) <= now - self.window:
            mine.popitem(last=False)
        return mine

    def refuse(self, address: str, session: str | None, now: float) -> str | None:
        """Count session for address (and its network) and return None; or, past a bound, the
        refusal's message (its address's bound, or its network's), counting nothing."""
        self.calls += 1
        if self.calls % 1024 == 0:  # now and then, forget addresses idle for a whole window
            self.seen = {a: m for a, m in self.seen.items()
                         if m and next(reversed(m.values())) > now - self.window}
        key = session if session is not None else f"call-{self.calls}"
        mine, network = self._recent(address, now), network_of(address)
        theirs = self._recent(f"network {network}", now) if network is not None else None
        if session is not None and session in mine:
            mine.move_to_end(session)
        elif len(mine) >= self.per_address:
            return self._message(self.per_address)
        elif theirs is not None and len(theirs) >= self.per_network:
            return self._message(self.per_network, network)
        mine[key] = now
        if theirs is not None:
            theirs[(address, key)] = now
            theirs.move_to_end((address, key))
        return None

    def admit(self, address: str, session: str | None, now: float) -> bool:
        return self.refuse(address, session, now) is None


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
        self.open_pages = open_pages  # sessions whose heartbeat is connected (RequestGuard.beating)
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
    to RequestGuard's max_page_query) arrives in pieces, and was refused though the guard admits it
    (on loopback it usually came in one piece and passed). Heads may now reach the longest query and
    HEAD_ROOM: still bounded. Gradio makes uvicorn's Config itself, so this sets the bound its h11
    protocol falls back on. Process-wide; httptools, where installed, reads heads of any length."""
    from uvicorn.protocols.http import h11_impl

    h11_impl.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE = max(h11_impl.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE,
                                                     max_query + MAX_URL + HEAD_ROOM)


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class RequestGuard:
    """ASGI middleware in front of Gradio's routes.

    - Every request's body is bounded: an upload's by max_upload bytes and one file, any other's
      by max_body; one over is refused (413) as soon as it says so or sends the bytes.
    - Uploads, which stay on disk until the cache is cleaned, are bounded further (429): a
      public address may make per_address in `window` seconds, an IPv6 /48 a quarter of the
      uploads upload_bytes holds (at least per_address), and all visitors together
      upload_bytes. Set `window` to the longest a file stays in the cache: upload_bytes then
      bounds the disk uploads take. An upload is charged its declared length (max_upload if it
      declares none) while it runs and what it sent once it ends, so uploads side by side
      cannot overshoot; a body that runs past its declared length (a chunked body under a
      Content-Length of 1) is cut off (400).
    - A body must arrive within `deadline` seconds (408 after), so a slow one cannot hold an
      upload's charge or a connection for long.
    - Any other body may hold at most max_values arrays, objects and separators outside its
      strings (413), counted before Gradio parses it: a megabyte of [[]],[[]] took 0.7 s of the
      event loop to parse and ~35 MiB of a page's state to keep, though it holds no text.
    - Routes that would fetch a URL for the client (`/file=https://...`), feed data into a
      running event (`POST /stream/...`: this app has no streaming inputs), or that the app does
      not use are refused: `deep_link` wrote a page's whole state to disk, never cleaned;
      `dev/reload` streams poll every 50 ms for ever (4,000 of them slowed a page load 40-fold);
      the run history acts with the host's hub token for requests that look local.
    - A heartbeat names a session, so it counts as one of its address's `pages` (on leaving, it
      runs the page's unload outside the queue); so does the session hash of a body posted to
      `/call/<api>`, `/run/<api>` or `/api/<api>`, whose page state Gradio makes before the queue
      sees the call, or before it refuses one that must join the queue (1,001 made-up ones from
      one address expired another visitor's run in 13 s). A session hash may have MAX_SESSION
      characters (900 KB ones pinned 0.75 GiB).
    - A public address may hold max_open requests open at once, its IPv6 /48 max_open_network
      (429 past them): a page holds two streams (its heartbeat, its queue's results), and one
      address held 20,000 heartbeats of one session open, every file descriptor the server had:
      other visitors' requests hung, and the server logged an error on every accept.
    - A path or query string may have MAX_URL bytes (414; the page's own query, a share link
      with its prompt, max_page_query, also where the page appends it: queue/join and
      queue/data), and an upload's `upload_id` is dropped: Gradio kept a progress entry for each
      one for good (120 KB ids, 400 uploads: +43 MiB), and an upload's progress is answered "done"
      at once (UPLOAD_DONE), never by Gradio's stream.
    """

    def __init__(self, app, *, max_body: int, max_upload: int, per_address: int,
                 upload_bytes: int, window: float, deadline: float = 60.0,
                 pages: PerAddress | None = None, proxies: tuple = (),
                 min_charge: int = MIN_UPLOAD_CHARGE, max_values: int | None = None,
                 max_page_query: int = 64 * 2**10, max_open: int | None = None,
                 max_open_network: int | None = None, beating: Counter | None = None,
                 upload_note: str = " (one trace)"):
        self.app, self.max_body, self.max_upload = app, max_body, max_upload
        self.upload_note = upload_note  # what an upload too large is told after its size: the fix
        self.beating = beating  # session -> its heartbeat streams connected now (Tidy keeps those pages)
        self.max_open = max_open  # requests under way per public address (None: no bound)
        self.max_open_network = 4 * max_open if max_open_network is None and max_open else max_open_network
        self.open: Counter[str] = Counter()  # requests under way per public address and per /48
        self.max_page_query = max_page_query  # a share link carries its prompt, percent-encoded
        self.max_values = max_values
        self.per_address, self.upload_bytes, self.window = per_address, upload_bytes, window
        self.deadline, self.pages, self.proxies = deadline, pages, proxies
        self.min_charge = min_charge
        self.recent: deque[list] = deque()  # uploads: [when, bytes charged, address, held], oldest first
        self.charged = 0  # the bytes `recent` charges, kept as it changes (admit runs per upload)
        self.by_address: Counter[str] = Counter()  # uploads in `recent` per public address
        # and per IPv6 /48 (gate.network_of), at most a quarter of the uploads upload_bytes holds
        self.by_network: Counter[str] = Counter()
        self.per_network = max(per_address, upload_bytes // max(1, max_upload) // 4)

    def admit(self, address: str | None, declared: int | None) -> list:
        """A new upload's entry in `recent`; Refused when it may not start."""
        now = time.monotonic()
        while self.recent and self.recent[0][0] <= now - self.window:
            gone = self.recent.popleft()
            _, n, old, _ = gone
            gone[3] = False  # forgotten: settling it later changes no total
            self.charged -= n
            for counter, key in ((self.by_address, old), (self.by_network, network_of(old))):
                if key is not None:
                    counter[key] -= 1
                    if not counter[key]:
                        del counter[key]
        charge = self.max_upload if declared is None else declared
        if charge > self.max_upload:
            raise Refused(413, self.too_large(upload=True))
        if address is not None and self.by_address[address] >= self.per_address:
            raise Refused(429, f"too many uploads from your address: at most {self.per_address} in "
                               f"{round(self.window / 60)} minutes; wait a few minutes and try again")
        network = network_of(address)
        if network is not None and self.by_network[network] >= self.per_network:
            raise Refused(429, f"too many uploads from your network ({network}): at most "
                               f"{self.per_network} in {round(self.window / 60)} minutes; wait a few "
                               "minutes and try again")
        charge = max(charge, self.min_charge)
        if self.charged + charge > self.upload_bytes:
            raise Refused(429, "the server has taken all the uploads it can hold for now (they "
                               "are cleaned every few minutes); try again later")
        entry = [now, charge, address, True]
        self.recent.append(entry)
        self.charged += charge
        if address is not None:
            self.by_address[address] += 1
        if network is not None:
            self.by_network[network] += 1
        return entry

    def settle(self, entry: list, received: int) -> None:
        """An ended upload stays charged what it wrote (at least min_charge: its folder and file
        on disk) until the window forgets it."""
        charge = max(received, self.min_charge)
        if entry[3]:  # not yet forgotten (a body can outlast a short window)
            self.charged += charge - entry[1]
        entry[1] = charge

    def check_body(self, body: bytes, call: bool, address: str | None) -> Refused | None:
        """A whole body's values counted; a /call/, /run/ or /api/ body's session hash bounded and
        admitted as one of its address's pages: Gradio makes that page's state before the queue
        sees the call (or refuses it)."""
        if not is_utf8_json(body):  # JSON's other encodings would hide their values from containers()
            return Refused(400, NOT_UTF8)
        if self.max_values is not None and containers(body) > self.max_values:
            return Refused(413, TOO_MANY_VALUES.format(n=self.max_values))
        if not call:
            return None
        try:
            session = json.loads(body).get("session_hash")
        except (ValueError, AttributeError):  # not a JSON object: Gradio refuses it itself
            return None
        if not isinstance(session, str):
            return None  # no session: the queue counts the call as a fresh page
        if len(session) > MAX_SESSION:
            return Refused(400, LONG_SESSION)
        if address and self.pages and (why := self.pages.refuse(address, session, time.monotonic())):
            return Refused(429, why)
        return None

    def too_large(self, upload: bool) -> str:
        if upload:
            return TOO_LARGE.format(mib=self.max_upload / 2**20, what=self.upload_note)
        return TOO_LARGE.format(mib=self.max_body / 2**20, what="")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method"), scope.get("path", "")
        upload = method == "POST" and path.rstrip("/").endswith(UPLOAD_PATH)
        call = method == "POST" and _CALL.search(path) is not None
        most, entry = (self.max_upload if upload else self.max_body), None
        received, over, answered = 0, None, False
        try:
            query = scope.get("query_string") or b""
            # a share link: the page's query, which Gradio's page also sends on joining the queue and
            # reading its results (a long prompt's link opened, then every event failed with a 414)
            most_query = self.max_page_query if path in ("", "/") or _PAGE_QUERY.search(path) else MAX_URL
            if len(path) > MAX_URL or len(query) > most_query:
                raise Refused(414, f"the address is too long: at most {MAX_URL:,} characters of path and "
                                   f"{most_query:,} of query")
            if upload and query:  # Gradio tracks each upload_id's progress for good (names decoded)
                scope = dict(scope, query_string=_without(query, "upload_id"))
            if method in ("GET", "HEAD") and _FETCH.search(path):
                raise Refused(403, "this server fetches no URLs; open the address yourself")
            if method == "POST" and STREAM_PATH in path:
                raise Refused(404, "this app takes no streaming input")
            if _CLOSED.search(path):
                raise Refused(404, "not offered by this app")
            if method == "GET" and _UPLOAD_PROGRESS.search(path):
                return await _answer(send, 200, UPLOAD_DONE, b"text/event-stream")
            peer = (scope.get("client") or (None,))[0]
            address = public_address(visitor_address(peer, forwarded(scope.get("headers") or []),
                                                     self.proxies))
            beat = _HEARTBEAT.search(path)
            if beat and len(beat[1]) > MAX_SESSION:
                raise Refused(400, LONG_SESSION)
            if beat and address and self.pages and (why := self.pages.refuse(address, beat[1],
                                                                              time.monotonic())):
                raise Refused(429, why)
            try:
                declared = int(_header(scope, b"content-length") or b"")
            except ValueError:
                declared = None
            if not upload and declared is not None and declared > most:
                raise Refused(413, self.too_large(upload))
            held = self.hold(address)  # before an upload is counted: one refused here was
            if upload:  # counted among its address's 16 (and refused the next ones)
                try:
                    entry = self.admit(address, declared)
                except Refused:
                    self.release(held)
                    raise
        except Refused as e:
            return await _answer(send, e.status, e.message)
        parts = _Parts(_header(scope, b"content-type")) if upload else None
        started, body_done = time.monotonic(), False
        chunks = [] if (self.max_values is not None or call) and not upload else None  # read once whole

        async def counted_receive():
            nonlocal received, over, body_done
            if body_done:  # a streaming response listens for the disconnect: no deadline then
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), started + self.deadline - time.monotonic())
            except TimeoutError:
                over = Refused(408, f"the request's body took over {self.deadline:.0f} s to arrive; "
                                    "send it again on a faster connection")
                raise over from None
            body_done = message.get("type") != "http.request" or not message.get("more_body")
            if message.get("type") == "http.request":
                body = message.get("body", b"")
                received += len(body)
                if declared is not None and received > declared:  # charged as declared: no more
                    over = Refused(400, "the request's body is longer than its Content-Length")
                elif received > most:
                    over = Refused(413, self.too_large(upload))
                elif parts is not None and parts.feed(body) > 1:
                    over = Refused(413, "one file an upload: send each file in a request of its own")
                elif chunks is not None:
                    chunks.append(body)
                    if body_done:
                        over = self.check_body(b"".join(chunks), call, address)
                if over:
                    raise over
            return message

        async def refuse():
            nonlocal answered
            if not answered:
                answered = True
                await _answer(send, over.status, over.message)

        async def watched_send(message):  # the app's answer to a body cut short is ours instead
            nonlocal answered
            if over:
                return await refuse()
            answered = True
            await send(message)

        beating = beat[1] if beat and self.beating is not None else None
        if beating is not None:  # an open page's heartbeat: Tidy keeps its page while it lasts
            self.beating[beating] += 1
        try:
            await self.app(scope, counted_receive, watched_send)
        except Refused:
            await refuse()
        finally:
            if entry is not None:
                self.settle(entry, received)
            self.release(held)
            if beating is not None:
                self.beating[beating] -= 1
                if not self.beating[beating]:
                    del self.beating[beating]

    def release(self, held: list[str]) -> None:
        """Let go of the places hold() took."""
        for key in held:
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]

    def hold(self, address: str | None) -> list[str]:
        """Count a request under way for address and its /48: the keys to let go when it ends;
        Refused (429) past max_open or max_open_network."""
        if address is None or self.max_open is None:
            return []
        network = network_of(address)
        for key, bound, what in ((address, self.max_open, "your address"),
                                 (network, self.max_open_network, f"your network ({network})")):
            if key is not None and self.open[key] >= bound:
                raise Refused(429, f"too many requests open at once from {what}: at most {bound}; "
                                   "close other pages of this app and try again")
        held = [key for key in (address, network) if key is not None]
        for key in held:
            self.open[key] += 1
        return held


class _Parts:
    """Counts the parts of a multipart body as it streams by (its boundary's delimiters, less the
    closing one), taking the boundary from the Content-Type as Gradio's parser does."""

    def __init__(self, content_type: bytes | None):
        from python_multipart.multipart import parse_options_header

        boundary = parse_options_header(content_type or b"")[1].get(b"boundary")
        self.delimiter = b"--" + boundary if boundary else None
        self.seen, self.tail = 0, b""

    def feed(self, chunk: bytes) -> int:
        if self.delimiter:
            data = self.tail + chunk
            self.seen += data.count(self.delimiter)
            self.tail = data[-(len(self.delimiter) - 1):]
        return max(0, self.seen - 1)


def _without(query: bytes, name: str) -> bytes:
    """A query string less every `name` parameter."""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(k, v) for k, v in pairs if k != name]).encode("latin-1")


def _header(scope, name: bytes) -> bytes | None:
    """A request header's first value, as Starlette reads it."""
    return next((value for key, value in scope.get("headers") or [] if key.lower() == name), None)


async def _answer(send, status: int, message: str | bytes, kind: bytes = b"application/json") -> None:
    body = message if isinstance(message, bytes) else json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
