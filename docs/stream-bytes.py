"""What the Run tab streams: drive app.build's run handler in-process, postprocess each yield as
Gradio does, diff it against the last as Gradio's stream does, and count JSON bytes.

    PYTHONPATH=.:tests python docs/stream-bytes.py 512 throttle 0.3

usage: stream-bytes.py N [every|throttle] [round_seconds] [proposer] [temperature] [noise]
 every:    VIEW_SECONDS = PLOT_SECONDS = 0 (a view each round)
 throttle: the real throttle; round_seconds > 0 adds that much virtual time per engine event
           (emulating a slower model without waiting: the service's clock is moved)
"""
import asyncio
import json
import os
import sys
import time
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from conftest import long_pair  # noqa: E402

torch.set_num_threads(1)


n = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "throttle"
round_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
proposer = sys.argv[4] if len(sys.argv) > 4 else "draft"
temperature = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
noise = float(sys.argv[6]) if len(sys.argv) > 6 else 0.05
root = long_pair(noise)

from gradio import utils as gutils  # noqa: E402
from gradio.state_holder import SessionState  # noqa: E402

import app  # noqa: E402
from specviz import service  # noqa: E402
from specviz.settings import Limits, RunSettings  # noqa: E402
from specviz.store import ModelStore  # noqa: E402

if mode == "every":
    service.VIEW_SECONDS = service.PLOT_SECONDS = 0.0

# timing: the engine's events vs the rest of the generator
stats = {"model": 0.0, "view": 0.0, "post": 0.0, "diff": 0.0, "events": 0}
real_generate = service.generate
offset = [0.0]
real_time = time


def timed_generate(*a, **kw):
    it = real_generate(*a, **kw)
    while True:
        t = time.perf_counter()
        try:
            ev = next(it)
        except StopIteration:
            stats["model"] += time.perf_counter() - t
            return
        stats["model"] += time.perf_counter() - t
        offset[0] += round_seconds
        stats["events"] += 1
        yield ev


service.generate = timed_generate
service.time = SimpleNamespace(monotonic=lambda: real_time.monotonic() + offset[0], time=real_time.time,
                               perf_counter=real_time.perf_counter, strftime=real_time.strftime,
                               gmtime=real_time.gmtime)
real_view = service._view


def timed_view(*a, **kw):
    t = time.perf_counter()
    v = real_view(*a, **kw)
    stats["view"] += time.perf_counter() - t
    return v


service._view = timed_view

store = ModelStore({"tiny": (str(root / "target"), str(root / "draft"))}, device="cpu")
limits = Limits(max_new_tokens=512, max_job_seconds=1e9)
default = RunSettings(pair="tiny", chat=False, max_new_tokens=n, prompt="def fibonacci(n):")
demo = app.build(store, limits, default)
fn = next(f for f in demo.fns.values() if f.name == "run")
store.get(RunSettings(pair="tiny", dtype="float32"))
settings = dict(pair="tiny", target="", draft="", proposer=proposer, k=4, temperature=temperature, top_p=1.0,
                top_k=0, seed=0, max_new_tokens=n, prompt="def fibonacci(n):", chat=False, dtype="float32",
                nodes=0, branching=0)
request = SimpleNamespace(session_hash="s1", client=SimpleNamespace(host="127.0.0.1"), headers={},
                          query_params={})
state = SessionState(demo)
names = ["status", "text", "verdict", "stats", "timeline", "tpp", "cum", "acc", "k", "time", "tree",
         "slider", "overview", "tnodes", "tchain", "last"]
full_bytes = dict.fromkeys(names, 0)
diff_bytes = dict.fromkeys(names, 0)
unchanged = dict.fromkeys(names, 0)
last = None
yields = 0
plots_sent = [0]
per_yield = []


async def main():
    global last, yields
    gen = fn.fn(request, None, *settings.values())
    t0 = time.perf_counter()
    for out in gen:
        yields += 1
        t = time.perf_counter()
        data = await demo.postprocess_data(fn, list(out), state)
        stats["post"] += time.perf_counter() - t
        t = time.perf_counter()
        total = 0
        for i, name in enumerate(names):
            full = len(json.dumps(data[i]))
            if last is None:
                d = full
            else:
                edits = gutils.diff(last[i], data[i])
                d = len(json.dumps(edits))
                if not edits:
                    unchanged[name] += 1
            full_bytes[name] += full
            diff_bytes[name] += d
            total += d
        stats["diff"] += time.perf_counter() - t
        per_yield.append(total)
        plots_sent[0] += isinstance(data[5], dict) and "plot" in data[5]
        last = data
    wall = time.perf_counter() - t0
    final = out
    return wall, final


wall, final = asyncio.run(main())
status = final[0]
res = {"n": n, "mode": mode, "round_seconds": round_seconds, "proposer": proposer, "yields": yields,
       "wall": round(wall, 2), **{k: round(v, 2) for k, v in stats.items()},
       "diff_MB": round(sum(diff_bytes.values()) / 2**20, 2),
       "full_MB": round(sum(full_bytes.values()) / 2**20, 2),
       "plot_views": plots_sent[0], "max_yield_KB": round(max(per_yield) / 1024, 1), "status": status[:60]}
print(json.dumps(res))
print("diffKB", {k: round(v / 1024) for k, v in diff_bytes.items() if v > 1024})
print("fullKB", {k: round(v / 1024) for k, v in full_bytes.items() if v > 1024})
print("unchanged (of yields-1)", {k: v for k, v in unchanged.items() if v})
