"""Bounds in front of Gradio's own machinery, where one client could otherwise take what all share.

- Gradio's queue has one bound over every line, and /queue/join takes any event by its index:
  one client could fill it with cheap events and every other visitor would get "queue full".
  `cap_queue` gives each line (concurrency id) its own bound and one public address a share.
  It also refuses an event that names a file by URL: Gradio would download it, unbounded.
- No request body is bounded: a 200 MB JSON body to /queue/join took 0.8 GiB of server memory.
  Gradio's upload route writes every file of a request to disk (up to 1,000 files, each up to
  the file size limit) and keeps them until the cache is cleaned. `BodyGuard` (ASGI middleware)
  bounds every request's body, and one address's uploads and all uploads over the time a file
  can stay on disk.

Addresses count as gate.public_address says: a private one (a proxy's) is not counted.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict, defaultdict, deque

from specviz.gate import public_address

QUEUE_FULL = ("queue full: {what} already has {n} events waiting; wait for them to finish "
              "(or for the page to answer) and try again")
LINKED = ("files must be uploaded, not linked: upload the file first (the page does; "
          "gradio_client's handle_file with a local path does too)")
TOO_MANY_PAGES = ("too many pages from your address: {n} in {minutes} minutes; go on in a page "
                  "you have open (calls through gradio_client keep one session)")
UPLOAD_PATH = "/gradio_api/upload"
TOO_LARGE = "request too large: at most {mib:.1f} MiB a request{what}"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a scheme: http:, https:, data:, file: ...
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")  # C:\... is a path, not a scheme


def links_a_file(data) -> bool:
    """Whether event data names a file by URL ({"path": "https://..."} anywhere inside)."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            path = value.get("path")
            if isinstance(path, str) and _URL.match(path) and not _WINDOWS.match(path):
                return True
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def _address(request) -> str | None:
    client = getattr(request, "client", None)
    return public_address(getattr(client, "host", None))


class Pages:
    """The sessions (pages) each public address has used in the last `window` seconds. Gradio
    keeps state for a bounded number of sessions and drops the least recently used, so a
    client making up sessions would expire every other visitor's page; a call without a session
    gets a fresh one from Gradio, so each counts as a new page."""

    def __init__(self, per_address: int, window: float):
        self.per_address, self.window = per_address, window
        self.seen: dict[str, OrderedDict[str, float]] = {}  # address -> session -> last use
        self.calls = 0

    def admit(self, address: str, session: str | None, now: float) -> bool:
        self.calls += 1
        if self.calls % 1024 == 0:  # now and then, forget addresses idle for a whole window
            self.seen = {a: m for a, m in self.seen.items()
                         if m and next(reversed(m.values())) > now - self.window}
        mine = self.seen.setdefault(address, OrderedDict())
        while mine and next(iter(mine.values())) <= now - self.window:
            mine.popitem(last=False)
        if session is not None and session in mine:
            mine.move_to_end(session)
        elif len(mine) >= self.per_address:
            return False
        mine[session if session is not None else f"call-{self.calls}"] = now
        return True


def cap_queue(queue, per_line: int, per_address: int, pages: Pages | None = None) -> None:
    """Wrap a Gradio Queue's push: an event is refused ("queue_full", HTTP 503, with a message
    that names the fix) when its line already has per_line events waiting, or its client's public
    address has per_address waiting across all lines, or has used all its `pages`. Gradio's own
    bound then never binds first. An event whose data names a file by URL is refused (HTTP 400)."""
    push = queue.push
    joining: defaultdict[tuple, int] = defaultdict(int)  # pushes under way, by line and address

    def waiting(line: str | None, address: str | None) -> int:
        n = sum(1 for lane in queue.event_queue_per_concurrency_id.values() for event in lane.queue
                if (line is None or event.concurrency_id == line)
                and (address is None or _address(event.request) == address))
        return n + sum(count for (ln, ad), count in joining.items()
                       if (line is None or ln == line) and (address is None or ad == address))

    async def capped_push(body, request, username):
        fn = queue.blocks.fns.get(body.fn_index) if isinstance(body.fn_index, int) else None
        if fn is None:
            return await push(body, request, username)  # Gradio answers an unknown index itself
        if links_a_file(body.data):
            return False, LINKED, "error"
        line, address = fn.concurrency_id, _address(request)
        if waiting(line, None) >= per_line:
            return False, QUEUE_FULL.format(what="this line", n=per_line), "queue_full"
        if address is not None and waiting(None, address) >= per_address:
            return False, QUEUE_FULL.format(what="your address", n=per_address), "queue_full"
        if address is not None and pages and not pages.admit(address, body.session_hash, time.monotonic()):
            return False, TOO_MANY_PAGES.format(n=pages.per_address, minutes=round(pages.window / 60)), \
                "queue_full"
        joining[line, address] += 1
        try:
            return await push(body, request, username)
        finally:
            joining[line, address] -= 1
            if not joining[line, address]:
                del joining[line, address]

    queue.push = capped_push
    lines = {fn.concurrency_id for fn in queue.blocks.fns.values()}
    queue.max_size = per_line * max(1, len(lines))


class TooLarge(Exception):
    pass


class BodyGuard:
    """ASGI middleware. Every request's body is bounded: an upload's by max_upload bytes, any
    other's by max_body; one over is refused (413) as soon as it says so or sends the bytes.
    Uploads, which stay on disk until the cache is cleaned, are bounded further (429): a public
    address may make per_address in `window` seconds, and all visitors together upload_bytes.
    Set `window` to the longest a file stays in the cache: upload_bytes then bounds the disk
    uploads take. An upload is charged its declared length (max_upload if it declares none)
    while it runs, and what it sent once it ends, so uploads side by side cannot overshoot."""

    def __init__(self, app, *, max_body: int, max_upload: int, per_address: int,
                 upload_bytes: int, window: float):
        self.app, self.max_body, self.max_upload = app, max_body, max_upload
        self.per_address, self.upload_bytes, self.window = per_address, upload_bytes, window
        self.recent: deque[list] = deque()  # uploads: [when, bytes charged, address], oldest first

    def admit(self, address: str | None, declared: int | None) -> list | tuple[int, str]:
        """A new upload's entry in `recent`, or (HTTP status, message) when it is refused."""
        now = time.monotonic()
        while self.recent and self.recent[0][0] <= now - self.window:
            self.recent.popleft()
        charge = self.max_upload if declared is None else declared
        if charge > self.max_upload:
            return 413, self.too_large(upload=True)
        if address is not None and sum(a == address for _, _, a in self.recent) >= self.per_address:
            return 429, (f"too many uploads from your address: at most {self.per_address} in "
                         f"{round(self.window / 60)} minutes; wait a few minutes and try again")
        if sum(n for _, n, _ in self.recent) + charge > self.upload_bytes:
            return 429, ("the server has taken all the uploads it can hold for now (they are "
                         "cleaned every few minutes); try again later")
        entry = [now, charge, address]
        self.recent.append(entry)
        return entry

    def too_large(self, upload: bool) -> str:
        if upload:
            return TOO_LARGE.format(mib=self.max_upload / 2**20, what=" (one trace)")
        return TOO_LARGE.format(mib=self.max_body / 2**20, what="")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope.get("method") == "POST" and scope.get("path", "").rstrip("/").endswith(UPLOAD_PATH)
        most = self.max_upload if upload else self.max_body
        try:
            declared = int(dict(scope.get("headers") or []).get(b"content-length", b""))
        except ValueError:
            declared = None
        entry = None
        if upload:
            entry = self.admit(public_address((scope.get("client") or (None,))[0]), declared)
            if isinstance(entry, tuple):
                return await _answer(send, *entry)
        elif declared is not None and declared > most:
            return await _answer(send, 413, self.too_large(upload))
        received, over, answered = 0, False, False

        async def counted_receive():
            nonlocal received, over
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > most:
                    over = True
                    raise TooLarge
            return message

        async def refuse():
            nonlocal answered
            if not answered:
                answered = True
                await _answer(send, 413, self.too_large(upload))

        async def watched_send(message):  # the app's answer to a body cut short is ours instead
            nonlocal answered
            if over:
                return await refuse()
            answered = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except TooLarge:
            await refuse()
        finally:
            if entry is not None:
                entry[1] = received  # what it wrote stays charged until the window forgets it


async def _answer(send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
