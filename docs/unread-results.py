"""Messages Gradio holds for results nobody reads: runs posted through /call/run and never read,
from one address, with hooks.cap_queue dropping them UNREAD seconds after they finished.

    PYTHONPATH=.:tests UNREAD=5 ROUND_DELAY=0.1 JOBS=5 python docs/unread-results.py

UNREAD=900 is the deployment's default (15 minutes: nothing is dropped during the script). The
tests' tiny pair, its rounds slowed by ROUND_DELAY seconds each (a 1.5B target's pass on a CPU is
about 0.3 s). FORWARDED: the client's address as the proxy says (a public one is counted).
"""

import ctypes
import gc
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import httpx
import torch
from conftest import EOS, make_model, make_tokenizer, perturbed

import app
from specviz import hooks, service
from specviz.settings import Limits, RunSettings
from specviz.store import ModelStore

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
root = Path(tempfile.mkdtemp())
tok = make_tokenizer(root)
target = make_model("qwen2", len(tok), 0, tok.convert_tokens_to_ids(EOS))
for name, model in (("target", target), ("draft", perturbed(target, 1, 0.05))):
    model.save_pretrained(root / name)
    tok.save_pretrained(root / name)
store = ModelStore({"tiny": (str(root / "target"), str(root / "draft"))}, device="cpu")
real, delay = service.generate, float(os.environ.get("ROUND_DELAY", "0.3"))


def slow(*args, **kwargs):
    for event in real(*args, **kwargs):
        time.sleep(delay)
        yield event


service.generate = slow
hooks.UNREAD_SECONDS = float(os.environ.get("UNREAD", "900"))
demo = app.build(store, Limits(max_new_tokens=200),
                 RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, **app.launch_options(demo))
url, queue = f"http://127.0.0.1:{port}/gradio_api/", demo._queue
values = dict(pair="tiny", target="", draft="", proposer="draft", k=4, temperature=0.0, top_p=1.0, top_k=0,
              seed=0, max_new_tokens=200, prompt="", chat=False, dtype="float32", nodes=0, branching=0)
headers = {"x-forwarded-for": os.environ.get("FORWARDED", "81.2.69.160")}


def held() -> tuple[int, float]:
    """Messages Gradio holds for its sessions, and their outputs' size in MiB."""
    messages = [m for q in list(queue.pending_messages_per_session.values()) for m in list(q._queue)]
    size = sum(len(json.dumps(getattr(m, "output", None), default=str)) for m in messages)
    return len(messages), size / 2**20


def rss() -> float:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) / 1024


for i in range(int(os.environ.get("JOBS", "5"))):
    values["prompt"] = f"def fibonacci_{i}(n):"  # no baseline reuse
    r = httpx.post(url + "call/run", json={"data": [values[k] for k in demo.specviz.names]}, headers=headers,
                   timeout=30)
    lanes = queue.event_queue_per_concurrency_id.values()
    while len(demo.specviz.gate) or any(lane.queue for lane in lanes) or any(queue.active_jobs):
        time.sleep(0.5)  # the run and its baseline finish on the server; nobody reads them
    n, mib = held()
    print(f"after run {i + 1} ({r.status_code}): {n} messages held, {mib:.1f} MiB of outputs; "
          f"RSS {rss():.0f} MiB", flush=True)
demo.close()
