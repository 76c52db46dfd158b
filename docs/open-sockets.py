"""Requests open at once from one address (docs/benchmarks.md, the thirty-sixth stop): N raw
sockets from one forwarded address, each sending `GET /gradio_api/heartbeat/<one session>`, held
open; RequestGuard's max_open (3 requests a page: 186 an address by default) answers the first
ones 200 and the rest 429. Prints a Markdown table: the statuses answered, the server's file
descriptors while they are held and WAIT seconds later (the client still holding every socket:
uvicorn's 5 s keep-alive closes the refused ones), and how long another visitor's `GET /config`
took while they were held (after one request before them: a fresh server's first is slower).
From the repository root:

    python docs/open-sockets.py              # 1,000 sockets against docs/soak-serve.py's server
    python docs/open-sockets.py 400 --wait 8
    python docs/open-sockets.py --url http://127.0.0.1:7873/ --pid "$(cat /tmp/soak/server.pid)"

Without --url it starts docs/soak-serve.py (the app on the tests' tiny pair, with the default
SPECVIZ_MAX_SESSIONS the bounds above come from; MODELS: where that pair is saved, made if
missing, /tmp/soak/models) on a free port, and stops it at the end, or on Ctrl-C. With --url the
server is yours (plain http only); its file descriptors are read from /proc/PID/fd when --pid
names it. The server's peer must be a trusted proxy (SPECVIZ_TRUST_FORWARDED: loopback by
default) for X-Forwarded-For to name the visitor. Each socket is a file descriptor here and one
in the server: `ulimit -n` must exceed N in both (the script checks, and says so).
"""

import argparse
import errno
import os
import pathlib
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from urllib.parse import urlsplit

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPARE_FDS = 64  # descriptors a process needs besides the sockets (its libraries, files, the listener)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fd_limit(pid: int | None = None) -> int:
    """The soft limit on open files: this process's (raised to the hard limit where it is lower),
    or another process's as /proc/PID/limits says."""
    if pid is None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a child started now inherits it
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for line in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            value = line.split()[3]
            return resource.RLIM_INFINITY if value == "unlimited" else int(value)
    raise RuntimeError(f"/proc/{pid}/limits names no open-file limit")


def open_fds(pid: int | None) -> int | None:
    """The server's open file descriptors now (None: no pid to read them from)."""
    return len(os.listdir(f"/proc/{pid}/fd")) if pid is not None else None


class Server:
    """docs/soak-serve.py on a free port, in a session of its own (Ctrl-C here stops it from
    finally:, not in the middle of its start-up)."""

    def __init__(self):
        self.port, self.lines, self.ready = free_port(), deque(maxlen=40), threading.Event()
        env = dict(os.environ, PORT=str(self.port))
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "docs" / "soak-serve.py")], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.pid, self.url = self.proc.pid, f"http://127.0.0.1:{self.port}/"
        threading.Thread(target=self.drain, daemon=True).start()

    def drain(self) -> None:
        """Its output, read to the end so that it never blocks on a full pipe."""
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("READY"):
                self.ready.set()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("docs/soak-serve.py did not start:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def hold(socks: list, url: str, n: int, session: str, forwarded: str, timeout: float) -> Counter:
    """n sockets, each sending the heartbeat request, added to socks (left open): the statuses
    their answers began with ("no answer" where none came within timeout)."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise SystemExit(f"--url must be plain http (raw sockets here): {url}")
    host, port = parts.hostname, parts.port or 80
    request = (f"GET {parts.path.rstrip('/')}/gradio_api/heartbeat/{session} HTTP/1.1\r\n"
               f"Host: {parts.netloc}\r\nX-Forwarded-For: {forwarded}\r\n\r\n").encode()
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=timeout)
        socks.append(s)
        s.sendall(request)
        s.setblocking(False)
    heads, statuses = {s: b"" for s in socks}, Counter()
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while heads and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                s = key.fileobj
                data = s.recv(4096)
                heads[s] += data
                if b"\r\n" in heads[s] or not data:  # the status line (or the server closed it)
                    line = heads.pop(s).split(b"\r\n")[0].split()
                    statuses[line[1].decode() if len(line) > 1 else "closed, no answer"] += 1
                    sel.unregister(s)
    statuses["no answer"] += len(heads)
    return +statuses


def closed_by_server(socks: list) -> int:
    """How many of the sockets the server has closed (read to their end without waiting)."""
    closed = 0
    for s in socks:
        try:
            while s.recv(65536):  # a 200's stream, or the rest of a 429's answer
                pass
            closed += 1
        except BlockingIOError:
            pass
        except OSError as e:
            closed += e.errno in (errno.ECONNRESET, errno.EPIPE)
    return closed


def get_config(url: str, forwarded: str) -> str:
    """Another visitor's GET /config: its status and time, or the error that ended it."""
    start = time.perf_counter()
    try:
        r = httpx.get(url.rstrip("/") + "/config", headers={"X-Forwarded-For": forwarded}, timeout=10)
        return f"{r.status_code} in {time.perf_counter() - start:.2f} s"
    except httpx.HTTPError as e:
        return f"{type(e).__name__} after {time.perf_counter() - start:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, nargs="?", default=1000, help="sockets to open (1000)")
    ap.add_argument("--url", help="a running server's address (default: start docs/soak-serve.py)")
    ap.add_argument("--pid", type=int, help="with --url: the server's process, to read its file descriptors")
    ap.add_argument("--forwarded", default="3.3.3.9", help="the X-Forwarded-For all sockets send (3.3.3.9)")
    ap.add_argument("--other", default="4.4.4.4", help="the other visitor's X-Forwarded-For (4.4.4.4)")
    ap.add_argument("--session", default="open-sockets", help="the one session every heartbeat names")
    ap.add_argument("--wait", type=float, default=8.0, help="seconds till they are read again (8)")
    ap.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for answers (15)")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds the server may take to start")
    args = ap.parse_args()

    need = args.n + SPARE_FDS
    mine = fd_limit()
    if mine < need:
        raise SystemExit(f"ulimit -n is {mine} here: {args.n} sockets need at least {need} descriptors "
                         f"(raise it, e.g. `ulimit -n {need}`, or open fewer)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleaned up as on Ctrl-C
    server, socks = None, []
    try:
        if args.url:
            url, pid = args.url, args.pid
        else:
            print(f"starting docs/soak-serve.py (ulimit -n {mine}) ...", file=sys.stderr)
            server = Server()
            server.wait_ready(args.start_timeout)
            url, pid = server.url, server.pid
        if pid is None:
            print("no --pid: the server's file descriptors (and its limit) are not read", file=sys.stderr)
        theirs = fd_limit(pid) if pid is not None else None
        if theirs is not None and theirs < need:  # past it uvicorn logs EMFILE on every accept
            raise SystemExit(f"the server's open-file limit is {theirs}: {args.n} sockets need at least "
                             f"{need} there (raise its ulimit -n, or open fewer)")
        before, idle = open_fds(pid), get_config(url, args.other)
        print(f"{args.n:,} sockets to {url} from X-Forwarded-For: {args.forwarded} ...", file=sys.stderr)
        statuses = hold(socks, url, args.n, args.session, args.forwarded, args.timeout)
        time.sleep(0.5)  # the last answers' requests settled
        held = open_fds(pid)
        config = get_config(url, args.other)
        time.sleep(args.wait)
        later, closed = open_fds(pid), closed_by_server(socks)
    finally:
        for s in socks:
            s.close()
        if server is not None:
            server.stop()

    def fds(value: int | None) -> str:
        return "not read (give --pid)" if value is None else f"{value:,}"

    answered = ", ".join(f"{count:,} × {status}" for status, count in sorted(statuses.items()))
    print(f"| | answered | server file descriptors | another visitor's `GET /config` |\n"
          f"| --- | --- | --- | --- |\n"
          f"| while held | {answered} | {fds(held)} | {config} |\n"
          f"| {args.wait:g} s later, the client still holding all {args.n:,} | | {fds(later)} | |\n")
    print(f"(before: server file descriptors {fds(before)}, `GET /config` {idle}; sockets the server "
          f"had closed {args.wait:g} s later: {closed:,} of {args.n:,})")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # main's finally: closed the sockets and stopped the server it started
        sys.exit("interrupted")
