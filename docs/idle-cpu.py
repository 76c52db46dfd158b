"""What the app costs while nobody uses it: CPU (all threads, as a share of one core), wake-ups a
second (voluntary context switches) and resident memory of a server left idle. From the repository
root:

    python docs/idle-cpu.py                  # starts python app.py (the embedded pair) on a free port
    python docs/idle-cpu.py --pid PID        # a server already running: its process id

Started here, the server is measured once it answers GET / and its pair's preload has had SETTLE
seconds, and stopped at the end (or on Ctrl-C). No page is opened: an idle page adds no request
(the heartbeat is one stream Gradio writes to every 15 s).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime, every thread


def wakeups(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split()[1])
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(settle: float) -> subprocess.Popen:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"python app.py ended with {proc.returncode} before serving")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.terminate()
        raise SystemExit("python app.py did not answer GET / within 5 minutes")
    time.sleep(settle)  # the default pair's preload (a thread) ends
    return proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, help="a running server's process id (default: start python app.py)")
    p.add_argument("--seconds", type=float, default=120.0, help="how long to watch it idle")
    p.add_argument("--settle", type=float, default=60.0, help="seconds after GET / before measuring")
    args = p.parse_args()
    proc = None if args.pid else start(args.settle)
    pid = args.pid or proc.pid
    try:
        c0, w0, t0 = cpu_seconds(pid), wakeups(pid), time.monotonic()
        time.sleep(args.seconds)
        c1, w1, t1 = cpu_seconds(pid), wakeups(pid), time.monotonic()
        span = t1 - t0
        print(json.dumps({"seconds": round(span, 1), "percent_of_a_core": round(100 * (c1 - c0) / span, 2),
                          "wakeups_per_second": round((w1 - w0) / span, 1), "rss_mb": round(rss_mb(pid)),
                          "loadavg": Path("/proc/loadavg").read_text().split()[:3]}))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
