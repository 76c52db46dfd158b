"""A fair gate in front of the one loaded model: jobs hold it one at a time, in arrival order.

Each visitor (a session) may have at most one job waiting or running; a second one is refused at
once with Busy. A waiting job polls, so the app can yield "N ahead of you" and Stop can act while
it waits. Plain Python, no Gradio: the app turns Busy (a ValueError) into a message.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

BUSY = "busy: you already have a job waiting or running; wait for it or press Stop"


class Busy(ValueError):
    pass


class Ticket:
    """One job's place in line; release it (or leave the `with` block) when the job ends."""

    def __init__(self, gate: Gate, session: str):
        self.gate, self.session = gate, session
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
    """

    def __init__(self, max_jobs: int = 16, stale_after: float = 900.0):
        self.max_jobs, self.stale_after = max_jobs, stale_after
        self._cond = threading.Condition()
        self._line: list[Ticket] = []
        self._anonymous = itertools.count()

    def ticket(self, session: str | None) -> Ticket:
        """A place at the end of the line; Busy if this session already has one or the line is full."""
        with self._cond:
            self._drop_stale()
            if session is not None and any(t.session == session for t in self._line):
                raise Busy(BUSY)
            if len(self._line) >= self.max_jobs:
                raise Busy(f"busy: {len(self._line)} jobs are already waiting for the model, the most "
                           "this deployment queues; try again in a minute")
            ticket = Ticket(self, session if session is not None else f"anonymous-{next(self._anonymous)}")
            self._line.append(ticket)
            return ticket

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
