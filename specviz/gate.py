"""Sharing one server among visitors: a fair gate in front of the model, and a bounded shelf
for the traces they look at. Plain Python, no Gradio.

Gate: jobs hold the model one at a time, in arrival order. Each visitor (a session) may have at
most one job waiting or running; a second one is refused at once with Busy (a ValueError the app
shows as a message). The session is the client's to choose, so two more limits stand on what the
server sees: one public address may hold at most `per_address` places (a private one, such as a
proxy's, is not counted: behind a proxy, the visitor's forwarded address counts, visitor_address),
and jobs asked for without a session share one place. Through Gradio no job comes without one: an
HTTP API call that names no session gets its own event id as its session (gradio's Event), a
session of its own like any made-up one, so there the address limit is what holds. A waiting
job polls, so the app can yield "N ahead of you" and Stop can act while it waits.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

from .untrusted import flag, held_bytes

BUSY = ("busy: you already have a job waiting or running; wait for it, or press the Run tab's Stop "
        "(it stops every job of the page; the lab's Stop, only the lab's)")


BUSY_API = ("busy: a call without a session is already waiting or running (calls without one share "
            "a place); wait for it, or call through a session (the page, or gradio_client)")
NO_SESSION = "no-session"


class Busy(ValueError):
    pass


def public_address(address: str | None) -> str | None:
    """The client a public address stands for, else None: a private or loopback address is a
    proxy's or the operator's own, shared by many visitors, and a malformed one counts for
    nothing. An IPv4 address seen through IPv6 is the IPv4 one, and an IPv6 address counts as
    its /56 (a common home delegation: one subscriber has 256 /64s of 2^64 addresses each). A
    Teredo or 6to4 address is the IPv4 one it tunnels from: a 6to4 host holds a /48 (256 /56s),
    and Teredo's 2001::/32 is not global, so its clients went uncounted."""
    ip = _parse(address) if isinstance(address, str) else None
    if isinstance(ip, ipaddress.IPv6Address):
        tunnelled = (ip.teredo and ip.teredo[1]) or ip.sixtofour
        ip = tunnelled if tunnelled is not None and tunnelled.is_global else ip
    if ip is None or not ip.is_global:
        return None
    return str(ip) if ip.version == 4 else str(ipaddress.ip_network(f"{ip}/56", strict=False))


def network_of(address: str | None) -> str | None:
    """The /48 that holds an IPv6 client's /56 (public_address), else None: one tunnel broker's
    free /48 is 256 /56s, each a client of its own, so the gate also caps what one /48 holds."""
    if not isinstance(address, str) or ":" not in address:
        return None
    return str(ipaddress.ip_network(address, strict=False).supernet(new_prefix=48))


FORWARDED_HOPS = 8  # X-Forwarded-For entries read, from the right: proxies in front of one server
PROXIES = "127.0.0.0/8,::1/128"  # a same-host proxy's
# On a Space, Hugging Face's proxy reaches the app from a 10.x address. Off a Space 10.0.0.0/8 is
# not trusted by default: there it may hold visitors (a LAN's, behind a same-host proxy), and a
# visitor the walk trusts as a proxy names any address it likes to the left of its own.
SPACE_PROXIES = PROXIES + ",10.0.0.0/8"


def proxy_networks(text: str | None, space: bool = False) -> tuple:
    """SPECVIZ_TRUST_FORWARDED: "1", unset or blank, PROXIES (SPACE_PROXIES on a Space); "0",
    "false", "no" or "off", none; else the proxies' networks, comma-separated
    ("10.0.0.0/8,172.17.0.0/16"). ValueError on a network that does not parse."""
    value = (text or "").strip().lower() or "1"  # blank keeps the default, as every setting's does
    switch = flag(value)
    if switch is False:
        return ()
    if switch:
        value = SPACE_PROXIES if space else PROXIES
    try:
        return tuple(ipaddress.ip_network(n.strip(), strict=False) for n in value.split(",") if n.strip())
    except ValueError as e:
        raise ValueError(f"SPECVIZ_TRUST_FORWARDED: {e}; give 0, 1 or the proxies' networks, e.g. "
                         f"{PROXIES}") from None


def _ip(text: str):
    """An address as a forwarded entry may write it ("1.2.3.4", "1.2.3.4:80", "[::1]:80"), or None."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":")[0]
    return _parse(text)


def _parse(text: str):
    """An address without port or brackets (an IPv6 zone dropped, an IPv4 one seen through IPv6
    as the IPv4 one), or None."""
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def visitor_address(peer: str | None, forwarded: str | list[str] | None, proxies: tuple = ()) -> str | None:
    """The address that stands for the visitor: the peer's own, unless the peer is one of the
    trusted proxies (`proxies`: networks, proxy_networks) that forwarded the request; then the
    first entry of its X-Forwarded-For (`forwarded`: the header's lines), from the right, that is
    not a trusted proxy's. Each hop appends the address it was reached from, so the entries left
    of the visitor's are the visitor's own to write, and reading from the right past trusted
    proxies only, a visitor cannot choose what counts: a private visitor (a LAN's, behind a
    same-host nginx) is itself, which counts for nothing (public_address), as before. An entry
    that is no address ends the walk (None). No proxies: the peer alone."""
    ip = _ip(peer) if isinstance(peer, str) else None

    def trusted(address) -> bool:
        return any(address.version == net.version and address in net for net in proxies)

    if ip is None or not forwarded or not trusted(ip):
        return peer if isinstance(peer, str) else None
    entries = ",".join([forwarded] if isinstance(forwarded, str) else forwarded).split(",")
    for entry in reversed(entries[-FORWARDED_HOPS:]):
        hop = _ip(entry)
        if hop is None:
            return None
        if not trusted(hop):
            return str(hop)
    return peer


def client(session: str | None, address: str | None) -> tuple[str, str | None]:
    """Who is asking, as the gate and the shelf count it: the session (calls without one share
    NO_SESSION) and the public address (public_address)."""
    return NO_SESSION if session is None else session, public_address(address)


class Ticket:
    """One job's place in line; release it (or leave the `with` block) when the job ends."""

    def __init__(self, gate: Gate, session: str, address: str | None = None):
        self.gate, self.session, self.address = gate, session, address
        self.seen = time.monotonic()  # last sign of life: a poll, or a yield of the job

    def waiting(self, poll: float = 1.0) -> Iterator[int]:
        """Yield how many jobs are ahead, about every `poll` seconds, until this one holds the model."""
        timeout = 0.0  # the first answer at once, then one per poll
        while (ahead := self.gate._wait(self, timeout)) > 0:
            yield ahead
            timeout = poll

    def touch(self) -> None:
        self.seen = time.monotonic()

    def release(self) -> None:
        self.gate._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Gate:
    """FIFO line of tickets; the first holds the model.

    max_jobs bounds the line (waiting and running together). A waiter that stops polling for
    `stale_after` seconds (its handler was dropped without being closed) loses its place, and so
    does a holder that shows no sign of life for that long, so a lost job cannot block the model.
    One IPv6 /48 (network_of) holds at most per_network places: a quarter of the line,
    so that one free /48 cannot fill the line while many subscribers of one carrier's /48 can
    still queue beside each other.
    """

    def __init__(self, max_jobs: int = 16, stale_after: float = 900.0, per_address: int = 2):
        self.max_jobs, self.stale_after, self.per_address = max_jobs, stale_after, per_address
        self.per_network = max(per_address, max_jobs // 4)
        self._cond = threading.Condition()
        self._line: list[Ticket] = []

    def ticket(self, session: str | None, address: str | None = None) -> Ticket:
        """A place at the end of the line; Busy if this session (or, without one, any other call
        without one) already has one, if this public address holds per_address (its IPv6 /48
        per_network), or if the line is full. address: the client's, as the server sees it (see
        public_address)."""
        session, address = client(session, address)
        with self._cond:
            self._drop_stale()
            if any(t.session == session for t in self._line):
                raise Busy(BUSY if session != NO_SESSION else BUSY_API)
            if address and sum(t.address == address for t in self._line) >= self.per_address:
                raise Busy(f"busy: {self.per_address} jobs from your address are already waiting or "
                           "running, the most this deployment allows; wait for one to finish")
            network = network_of(address)
            if network and sum(network_of(t.address) == network for t in self._line) >= self.per_network:
                raise Busy(f"busy: {self.per_network} jobs from your network ({network}) are already "
                           "waiting or running, the most this deployment allows; wait for one to finish")
            if len(self._line) >= self.max_jobs:
                raise Busy(f"busy: {len(self._line)} jobs are already running or waiting for the model, "
                           "the most this deployment queues; try again in a minute")
            ticket = Ticket(self, session, address)
            self._line.append(ticket)
            return ticket

    def holds(self, session: str | None) -> bool:
        """Whether this session (a page) has a job waiting or running; never for calls without one."""
        with self._cond:
            return session is not None and any(t.session == session for t in self._line)

    def ahead(self, ticket: Ticket) -> int:
        with self._cond:
            return self._line.index(ticket) if ticket in self._line else 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._line)

    def _wait(self, ticket: Ticket, timeout: float) -> int:
        with self._cond:
            ticket.touch()
            if ticket not in self._line:  # released or dropped as stale: do not run unguarded
                raise Busy("the wait for the model was lost: press Run again")
            if self._line[0] is not ticket:
                self._cond.wait(timeout)
                ticket.touch()
                self._drop_stale()
            if ticket not in self._line:
                raise Busy("the wait for the model was lost: press Run again")
            return self._line.index(ticket)

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
                self._cond.notify_all()

    def _drop_stale(self) -> None:
        now = time.monotonic()
        alive = [t for t in self._line if now - t.seen <= self.stale_after]
        if len(alive) != len(self._line):
            self._line[:] = alive
            self._cond.notify_all()


class Held(NamedTuple):
    """One trace on the shelf and whose it is."""
    session: str
    trace: object
    nbytes: int  # the memory it holds, estimated from its JSON (untrusted.held_bytes)
    address: str | None  # public_address of the client that put it
    uploaded: bool  # opened from a file (cheap to repeat), not run through the gate


LET_GO_KEPT = 4096  # evicted keys, and sessions whose page state went, remembered to tell their pages


class Shelf:
    """Traces that visitors look at, held by the server; the page keeps only a key (a str).

    The newest trace per session (calls without one share one), at most per_address traces per
    public address (sessions are the client's to make up), and at most max_bytes of memory in all
    (estimated from each trace's JSON: untrusted.held_bytes), so a crowd of visitors or of
    uploads cannot grow memory without bound. Over max_bytes, the least recently used uploaded
    trace goes first, and a run's only when no other upload is left: runs pass the gate one at a
    time, uploads are cheap to repeat (and behind a proxy come from no countable address), so a
    flood of uploads pushes out only uploads. The app drops a page's trace with the page's state
    (the State's delete callback: hooks.Tidy, or Gradio's expiry), and the shelf remembers that
    page's session, so a page still open is told why its run is gone.
    """

    def __init__(self, max_bytes: int = 256 * 2**20, per_address: int = 2):
        self.max_bytes, self.per_address = max_bytes, per_address
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Held] = OrderedDict()  # key -> what it holds, oldest first
        self._let_go: OrderedDict[str, str] = OrderedDict()  # keys evicted (not dropped): their sessions
        self._forgotten: OrderedDict[str, None] = OrderedDict()  # sessions whose state went, oldest first

    def put(self, session: str | None, trace, nbytes: int | None = None, address: str | None = None,
            uploaded: bool = False) -> str:
        nbytes = held_bytes(trace.to_json().encode()) if nbytes is None else nbytes
        session, address = client(session, address)
        key = f"trace-{secrets.token_urlsafe(12)}"
        with self._lock:
            for old in [k for k, held in self._items.items() if held.session == session]:
                del self._items[old]
            if address:
                mine = [k for k, held in self._items.items() if held.address == address]
                for old in mine[:max(0, len(mine) - self.per_address + 1)]:  # oldest first
                    self._evict(old)
            self._items[key] = Held(session, trace, nbytes, address, uploaded)
            while len(self._items) > 1 and self.nbytes > self.max_bytes:  # the new key is last
                uploads = (k for k, held in self._items.items() if held.uploaded and k != key)
                self._evict(next(uploads, next(iter(self._items))))
        return key

    def get(self, key) -> object | None:
        with self._lock:
            if not isinstance(key, str) or key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key].trace

    def opened(self, trace) -> bool:
        """Whether trace is on the shelf as a visitor opened it from a file (not a run here)."""
        with self._lock:
            return any(held.trace is trace and held.uploaded for held in self._items.values())

    def let_go(self, key) -> bool:
        """Whether the shelf let key's trace go while its page was open (among the last LET_GO_KEPT
        it let go): a newer one of its address's replaced it, or the memory was needed."""
        with self._lock:
            return isinstance(key, str) and key in self._let_go

    def of_session(self, session) -> object | None:
        """The trace a page's session holds (its newest), for a page whose key is gone with its
        state while the trace stayed (Gradio pushes the oldest pages out past its capacity without
        the State's delete callback); None for a job without a session (NO_SESSION)."""
        if not isinstance(session, str) or session == NO_SESSION:
            return None
        with self._lock:
            key = next((k for k, held in self._items.items() if held.session == session), None)
            if key is None:
                return None
            self._items.move_to_end(key)
            return self._items[key].trace

    def forgot(self, session) -> bool:
        """Whether the state of session's page went while it held a run (among the last
        LET_GO_KEPT): the page may still show that run."""
        with self._lock:
            return isinstance(session, str) and session in self._forgotten

    def _evict(self, key: str) -> None:  # under the lock
        _remember(self._let_go, key, self._items.pop(key).session)

    def drop(self, key) -> None:
        """Let key's trace go with its page's state (the State's delete callback), and remember
        the page's session (its trace's, or that of one let go before) to tell the page so."""
        with self._lock:
            if not isinstance(key, str):
                return
            held = self._items.pop(key, None)
            session = held.session if held is not None else self._let_go.get(key)
            if session is not None and session != NO_SESSION:
                _remember(self._forgotten, session)

    @property
    def nbytes(self) -> int:
        return sum(held.nbytes for held in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


def _remember(kept: OrderedDict, name: str, value=None) -> None:
    """Add name (with value) to kept, the newest LET_GO_KEPT only."""
    kept[name] = value
    kept.move_to_end(name)
    while len(kept) > LET_GO_KEPT:
        kept.popitem(last=False)
