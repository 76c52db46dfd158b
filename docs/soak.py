"""The soak's driver (docs/load-test.md, "Two thousand jobs in a row"): ARGV[1] seconds of pages
and jobs against docs/soak-serve.py's server, sampling its RSS, file descriptors, threads and
Gradio temp folder every 25 jobs into $SOAK_DIR/samples.csv. Traces to upload: $SOAK_DIR/traces/*.json
(save a few runs from the app's Save tab, or with specviz.service.run_views)."""

import csv
import glob
import json
import os
import random
import string
import sys
import threading
import time
import traceback

from gradio_client import Client, handle_file

D = os.environ.get("SOAK_DIR", "/tmp/soak")
URL = os.environ.get("SOAK_URL", "http://127.0.0.1:7873/")
PID = int(open(f"{D}/server.pid").read())
GT = f"{D}/gtmp"
SAVES = "/tmp/specviz-saves"
DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 25 * 60
TRACES = sorted(glob.glob(f"{D}/traces/*.json"))
lock = threading.Lock()
counts = {}
outcomes = {}
njobs = 0
errlog = open(f"{D}/nonok.jsonl", "a")
joblog = open(f"{D}/jobs.jsonl", "a")
PROPS = ["draft", "ngram", "hybrid", "adaptive", "tree", "none"]
WORDS = "the model draft token verify accept reject round tree python def return import class".split()


def dsize(path):
    n = b = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                b += os.path.getsize(os.path.join(root, f))
                n += 1
            except OSError:
                pass
    return n, b


def sample(label=""):
    st = open(f"/proc/{PID}/status").read()
    rss = int([line for line in st.splitlines() if line.startswith("VmRSS")][0].split()[1])
    thr = int([line for line in st.splitlines() if line.startswith("Threads")][0].split()[1])
    fds = len(os.listdir(f"/proc/{PID}/fd"))
    gn, gb = dsize(GT)
    sn, sb = dsize(SAVES)
    gdirs = len(os.listdir(GT)) if os.path.isdir(GT) else 0
    return dict(
        t=round(time.time() - T0, 1),
        jobs=njobs,
        rss_mib=round(rss / 1024, 1),
        fds=fds,
        threads=thr,
        gtmp_files=gn,
        gtmp_dirs=gdirs,
        gtmp_kib=round(gb / 1024, 1),
        saves_files=sn,
        saves_kib=round(sb / 1024, 1),
        label=label,
    )


def prompt(rng):
    r = rng.random()
    if r < 0.3:
        return rng.choice(
            ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "Once upon a time"]
        )
    if r < 0.6:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 15)))
    if r < 0.85:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 80)))
    return "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 40)))


def settings(rng, **over):
    s = {
        "pair": "tiny",
        "target": "",
        "draft": "",
        "proposer": rng.choice(PROPS),
        "k": rng.randint(1, 8),
        "temperature": rng.choice([0.0, 1.0]),
        "top_p": rng.choice([1.0, 0.9]),
        "top_k": rng.choice([0, 0, 20]),
        "seed": rng.randint(0, 10**6),
        "max_new_tokens": rng.randint(16, 120),
        "prompt": prompt(rng),
        "chat": False,
        "dtype": "float32",
        "nodes": rng.choice([0, 0, 8, 16]),
        "branching": rng.choice([0, 3]),
    } | over
    return s


KNOWN = (
    "temperature above 0",
    "busy",
    "waiting",
    "shorten",
    "no run yet",
    "too many",
    "the server no longer holds",
)


def record(kind, outcome, args, secs, err=None):
    global njobs
    with lock:
        njobs += 1
        counts[kind] = counts.get(kind, 0) + 1
        outcomes[(kind, outcome.split(":")[0])] = outcomes.get((kind, outcome.split(":")[0]), 0) + 1
        joblog.write(
            json.dumps(dict(t=round(time.time() - T0, 1), kind=kind, outcome=outcome, secs=round(secs, 2)))
            + "\n"
        )
        if outcome != "ok":
            errlog.write(
                json.dumps(dict(t=round(time.time() - T0, 1), kind=kind, outcome=outcome, args=args, err=err))
                + "\n"
            )
            errlog.flush()


def stream(kind, job, args, status_of=lambda u: u[0], cancel_first=False):
    t = time.monotonic()
    outcome = "ok"
    err = None
    try:
        for update in job:
            st = str(status_of(update))
            if cancel_first and not st.startswith(("waiting", "Loading")):
                job.cancel()
                outcome = "cancelled"
                break
        if outcome == "ok":
            last = job.result()
            if last is None:
                outcome = "empty"
            elif kind == "run" and not str(last[0]).startswith("Done"):
                outcome = "odd: " + str(last[0])[:100]
    except Exception as e:
        msg = str(e)
        outcome = (
            "busy"
            if msg.startswith("busy")
            else ("known: " + msg[:150] if any(w in msg for w in KNOWN) else "error: " + msg[:300])
        )
        err = traceback.format_exc()[-1500:] if outcome.startswith("error") else None
    record(kind, outcome, args, time.monotonic() - t, err)


def worker(wid):
    rng = random.Random(wid * 7919 + int(T0))
    c = None
    left = 0
    ran = False
    while time.time() - T0 < DURATION:
        if left <= 0:
            if c is not None:
                if rng.random() < 0.85:
                    c.close()
                else:
                    c.close()  # (all sessions are closed; see 'pre-closed' below)
            c = Client(URL, verbose=False, download_files=False)
            if rng.random() < 0.2:  # a page whose unload never fires: heartbeat gone before any job
                c.close()
                record("session (no unload)", "ok", {}, 0)
            else:
                record("session", "ok", {}, 0)
            left, ran = rng.randint(2, 6), False
        left -= 1
        r = rng.random()
        try:
            if r < 0.62:
                s = settings(rng)
                stream("run", c.submit(*s.values(), api_name="/run"), s)
                ran = True
            elif r < 0.70:
                s = settings(
                    rng, max_new_tokens=200, k=rng.randint(1, 3), proposer=rng.choice(["none", "draft"])
                )
                stream("run cancelled", c.submit(*s.values(), api_name="/run"), s, cancel_first=True)
            elif r < 0.78:
                if ran and rng.random() < 0.5:
                    a = [
                        "round",
                        rng.randint(1, 3),
                        rng.choice([1000, 5000, 20000]),
                        rng.sample(["exact", "correction_from_p", "argmax_draft", "tree_exact"], 2),
                    ]
                    stream("lab round", c.submit(*a, api_name="/lab"), a)
                else:
                    a = [
                        "example",
                        1,
                        rng.choice([1000, 20000, 100000]),
                        rng.sample(
                            ["exact", "correction_from_p", "argmax_draft", "mismatched_q", "poor_q"], 3
                        ),
                    ]
                    stream("lab example", c.submit(*a, api_name="/lab"), a)
            elif r < 0.86:
                n = rng.choice([10, 20, 30, 50])
                s = settings(rng, max_new_tokens=16, temperature=rng.choice([1.0, 1.0, 1.0, 0.0]))
                stream("e2e", c.submit(n, *s.values(), api_name="/e2e"), [n, s], status_of=lambda u: u)
            else:
                p = rng.choice(TRACES)
                stream(
                    "open trace",
                    c.submit(handle_file(p), api_name="/open_trace"),
                    p,
                    status_of=lambda u: u[-1],
                )
                ran = True
        except Exception as e:
            record("driver", "error: " + str(e)[:200], {}, 0, traceback.format_exc()[-1500:])
            time.sleep(1)
    if c is not None:
        c.close()


T0 = time.time()
new = not os.path.exists(f"{D}/samples.csv")
fcsv = open(f"{D}/samples.csv", "a", newline="")
s0 = sample("start")
w = csv.DictWriter(fcsv, fieldnames=list(s0))
if new:
    w.writeheader()
w.writerow(s0)
fcsv.flush()
print(s0, flush=True)
ths = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(2)]
for t in ths:
    t.start()
nxt = 25
while any(t.is_alive() for t in ths):
    time.sleep(1)
    if njobs >= nxt:
        s = sample()
        w.writerow(s)
        fcsv.flush()
        print(s, flush=True)
        nxt += 25
for t in ths:
    t.join()
s = sample("end-of-load")
w.writerow(s)
fcsv.flush()
print(s, flush=True)
print("COUNTS", counts, flush=True)
print("OUTCOMES", {f"{k[0]}|{k[1]}": v for k, v in outcomes.items()}, flush=True)
