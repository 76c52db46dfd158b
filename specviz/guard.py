"""Bounds in front of Gradio's own machinery, where one client could otherwise take what all
share. Three reviews played a hostile client against the app; docs/load-test.md has what each
attack did before and after.

- `RequestGuard` (ASGI middleware) bounds every request's body in size and time, an upload to
  one file, an address's uploads and all uploads over the time a file stays on disk; and it
  refuses routes that fetch URLs, feed running events, or that the app does not use.
- `PerAddress` counts the sessions (pages) each address uses in a window: for the guard, for
  hooks.cap_queue, and for the traces an address opens.
- What reaches into Gradio's and uvicorn's own objects (Gradio's queue, downloader, pages' state
  and cache; uvicorn's bound on a request's head) is in specviz/hooks.py.

Addresses count as gate.public_address says: a private one (a proxy's) is not counted.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter, OrderedDict, deque
from urllib.parse import parse_qsl, urlencode

from specviz.gate import network_of, public_address, visitor_address
from specviz.untrusted import containers, is_utf8_json

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
_CALL_V2 = re.compile(r"/gradio_api/call/v2/([^/]+)/?$")  # API docs' curl: a named event's call
NO_SUCH_ENDPOINT = "no such endpoint in this app: call one the API page lists (see 'Use via API')"
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
NOT_UTF8 = "a request's body must be UTF-8 JSON (as the page and gradio_client send it)"
MAX_URL = 4096  # bytes of a request's path, and of its query string
_PAGE_QUERY = re.compile(r"/gradio_api/queue/(join|data)/?$")  # the page's query string appended
_CALL = re.compile(r"/gradio_api/(call|run|api)/([^/]+)/?$")  # each makes the body's session's page
_QUEUE_DATA = re.compile(r"/gradio_api/queue/data/?$")  # a page's stream of its results
_CALL_RESULTS = re.compile(r"/gradio_api/call/(?:v2/)?[^/]+/([^/]+)/?$")  # an API call's results
NO_SUCH_STREAM = ("no results to read for this session or event: join the queue first (the page "
                  "does; gradio_client too)")
TOO_FEW_VALUES = "this endpoint takes {n} values in 'data', got {got}: send one for each of its inputs"


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
      the run history acts with the host's hub token for requests that look local. A call to
      `/call/v2/<name>` (the API page's curl) must name one of `endpoints`: Gradio looked an
      unknown name up with a KeyError, a 2.9 KB traceback in the log per call. A body posted to
      `/call/<name>`, `/run/<name>` or `/api/<name>` must name one of `calls` (its fn_index, or
      the name where it gives none), and a `/run/` or `/api/` one (outside the queue) send a
      value for each of its inputs: Gradio failed on either with a 1-5 KB traceback (about 1 MiB
      of log a second from one address). A page's stream of results (`/queue/data`) or an API
      call's (`/call/<name>/<event>`) must be one `streams` knows: Gradio started the stream,
      then raised its 404, a 5.7 KB traceback each.
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
                 endpoints: frozenset[str] | None = None, calls: dict | None = None,
                 streams=None, upload_note: str = " (one trace)"):
        self.app, self.max_body, self.max_upload = app, max_body, max_upload
        self.upload_note = upload_note  # what an upload too large is told after its size: the fix
        self.endpoints = endpoints  # the app's named events `/call/v2/<name>` may call (None: any)
        self.calls = calls  # {api name or fn_index: its inputs}: what a call may name (None: any)
        # (session hash or None, event id or None) -> whether Gradio holds results to stream for it
        self.streams = streams
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

    def check_body(self, body: bytes, call: re.Match | None, address: str | None) -> Refused | None:
        """A whole body's values counted; a /call/, /run/ or /api/ body's event known (and a
        /run/ or /api/ one's values, one for each input), its session hash bounded and admitted
        as one of its address's pages: Gradio makes that page's state before the queue sees the
        call (or refuses it)."""
        if not is_utf8_json(body):  # JSON's other encodings would hide their values from containers()
            return Refused(400, NOT_UTF8)
        if self.max_values is not None and containers(body) > self.max_values:
            return Refused(413, TOO_MANY_VALUES.format(n=self.max_values))
        if not call:
            return None
        try:
            fields = json.loads(body)
            session = fields.get("session_hash")
        except (ValueError, AttributeError):  # not a JSON object: Gradio refuses it itself
            return None
        if self.calls is not None and (why := self.check_call(call[1], call[2], fields)):
            return why
        if not isinstance(session, str):
            return None  # no session: the queue counts the call as a fresh page
        if len(session) > MAX_SESSION:
            return Refused(400, LONG_SESSION)
        if address and self.pages and (why := self.pages.refuse(address, session, time.monotonic())):
            return Refused(429, why)
        return None

    def check_call(self, route: str, name: str, fields: dict) -> Refused | None:
        """A call's event among `calls` (its fn_index where it gives one, else the path's name),
        and outside the queue (`/run/`, `/api/`: Gradio checks the values there, with a
        traceback) a value for each of its inputs. A fn_index or data of the wrong type is left
        to Gradio's own check of the body (422, quietly)."""
        index = None if route == "call" else fields.get("fn_index")  # /call/'s body has none: its name
        if index is None:
            key = name
        else:
            key = _as_index(index)
            if key is None:  # Gradio's own check of the body refuses it (422, quietly)
                return None
        if key not in self.calls:
            return Refused(404, NO_SUCH_ENDPOINT)
        data, needed = fields.get("data"), self.calls[key]
        if route != "call" and isinstance(data, list) and len(data) < needed:  # /call/'s simple
            return Refused(400, TOO_FEW_VALUES.format(n=needed, got=len(data)))  # format fills some
        return None

    def known_stream(self, path: str, query: bytes) -> bool:
        """Whether `streams` knows the results a GET of `/queue/data` or `/call/<name>/<event>`
        asks for (True for any other path, or a query Gradio refuses itself)."""
        if self.streams is None:
            return True
        if _QUEUE_DATA.search(path):
            # blank kept, the last of several taken: as Starlette reads the query for Gradio's route
            session = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get("session_hash")
            return session is None or self.streams(session, None)  # none: Gradio's 422
        event = _CALL_RESULTS.search(path)
        return event is None or self.streams(None, event[1])

    def too_large(self, upload: bool) -> str:
        if upload:
            return TOO_LARGE.format(mib=self.max_upload / 2**20, what=self.upload_note)
        return TOO_LARGE.format(mib=self.max_body / 2**20, what="")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method"), scope.get("path", "")
        upload = method == "POST" and path.rstrip("/").endswith(UPLOAD_PATH)
        call = _CALL.search(path) if method == "POST" else None
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
            if method == "POST" and self.endpoints is not None and (named := _CALL_V2.search(path)) \
                    and named[1] not in self.endpoints:  # Gradio raised a KeyError: a 2.9 KB traceback
                raise Refused(404, NO_SUCH_ENDPOINT)
            if method == "GET" and _UPLOAD_PROGRESS.search(path):
                return await _answer(send, 200, UPLOAD_DONE, b"text/event-stream")
            if method == "GET" and not self.known_stream(path, query):
                raise Refused(404, NO_SUCH_STREAM)
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


def _as_index(value) -> int | None:
    """A body's fn_index as Gradio's PredictBody reads it (pydantic's lax int: 3, "3", 3.0, True),
    or None where it refuses it."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(int).validate_python(value)
    except ValidationError:
        return None


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
