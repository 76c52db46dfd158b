"""specviz web app: layout and wiring only. The engine and views live in specviz/.

A public Space is hostile ground: every handler below takes raw values (preprocess=False), or
for a file the path Gradio gives, and coerces them itself, model jobs pass a fair gate (one at a
time, one per visitor), traces live on a bounded server-side shelf, and messages are escaped and
free of server paths.
"""

from __future__ import annotations

import os

if os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true"):  # zerogpu.active()
    # first: spaces refuses to load once CUDA is initialised, and it patches torch (so the models
    # can be placed on "cuda" in this process, which has no GPU) and gradio's launch
    import spaces  # noqa: F401

import argparse
import hashlib
import html
import json
import tempfile
import threading
import time
import weakref
from collections import Counter
from dataclasses import asdict, fields, replace
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

from specviz import embedded, lab, labview, presets, profiles, treeview, zerogpu
from specviz.gate import BUSY, Busy, Gate, Shelf, public_address
from specviz.guard import PerAddress, RequestGuard, request_address
from specviz.hooks import (
    Tidy,
    allow_long_heads,
    calls_of,
    cap_queue,
    drop_value,
    forbid_downloads,
    keep_closed_page,
    page_value,
    stream_known,
)
from specviz.lm import out_of_memory
from specviz.loading import check_device, default_device, needs_fetch
from specviz.render import legend_html
from specviz.service import (
    E2E_MAX_DRAFTS,
    Sides,
    View,
    check_continuations,
    continuations,
    e2e_tokens,
    explorer_refusal,
    replay_view,
    run_views,
    tree_round,
)
from specviz.settings import (
    CUSTOM,
    UI_MAX_K,
    Limits,
    RunSettings,
    coerce_int,
    from_query,
    from_trace,
    markdown_text,
    page_query_bound,
    public_message,
    settings_from,
)
from specviz.store import RELOAD_SHARE, ModelStore
from specviz.trace import MAX_TRACE_BYTES, loads, mib_over
from specviz.treedraft import MAX_BRANCHING, MAX_NODES
from specviz.untrusted import env_flag, held_bytes, port, visible_bidi
from specviz.views import WIDE

ASSETS = Path(__file__).parent / "assets"
EXAMPLES = json.loads((ASSETS / "examples.json").read_text())
INTRO = """# specviz: speculative decoding, visible
A small **draft** proposes *k* tokens; the **target** checks them all in one forward pass and keeps
the longest prefix it agrees with, plus one token of its own. Green tokens were drafted and kept, red
(struck through) ones were refused; orange (barred below, after a refusal) and blue (dashed, all k kept)
are the target's own, and grey (barred above) is the target's token in a round that drafted nothing.
Tap or point at a token for its p and q, or Tab to the text and use the arrow keys.
At temperature 0 the text is exactly the target's own;
at temperature > 0 it follows the target's distribution exactly (Leviathan et al. 2023).
"""
LAB_INTRO = """**Why the rule is exact.** A drafted x ~ q is kept with probability min(1, p(x)/q(x)); on a
rejection the target draws from normalize(max(0, p − q)). Kept mass min(p, q) plus the residual's share
adds up to p exactly, whatever q is. Run the right rule beside known-wrong variants and watch which ones
drift away from p."""
EXPLORER_INTRO = """A greedy run fixes the output for every k. From one recorded run (the target's token and
the drafter's guess at every position) this recomputes, without any model call, the rounds any k would
make. Slide k and watch the rounds re-lay themselves."""
# the k explorer before any run: the same words as for a page without a replayable run
EXPLORER_EMPTY = f"<div class='specviz-lab'>{html.escape(explorer_refusal(None))}</div>"
SETTING_NAMES = [f.name for f in fields(RunSettings)]
COPY_JS = """(query) => {
  const url = window.location.origin + window.location.pathname + '?' + query;
  // refused (no permission, or the click's activation spent while the server made the link):
  // the box shows the link, and the refusal is no uncaught error in the console
  try { navigator.clipboard.writeText(url).catch(() => {}); } catch (e) {}
  // a Space's page is framed by huggingface.co, which takes the query for its own address; a page
  // of its own has no parent to tell (posting to itself logged an origin error on every click)
  if (window.parent !== window) {
    try { window.parent.postMessage({queryString: '?' + query}, 'https://huggingface.co'); } catch (e) {}
  }
  return url;
}"""


# Plotly sizes a plot updated in a hidden tab (a trace opened from the Save tab updates the Run tab)
# as it was, not to its room (700 px in 390 here): a resize when a tab is shown fits them again.
REDRAW_JS = "() => { setTimeout(() => window.dispatchEvent(new Event('resize')), 50); }"
# The Token tree panel is open while the drafter is the token tree (a link's, an opened trace's or
# a visitor's choice): on chain runs it stood open above the plots holding only a note. In the
# browser alone: an event with a Python function would run outside the queue or wait in it.
# Run is enabled by the page's load (below), which sets a link's settings. A load the server
# refused (a full queue answers with a toast) left Run disabled for good: the page then enables it
# for the settings it shows, and says how to get the link's.
LOAD_REFUSED = ("⚠ The server was too busy to open this page's settings (a link's among them). Run "
                "runs the settings shown here; reload the page to get the link's.")
# The refused load also leaves Gradio's "Error" over each of its outputs, an opaque layer that hid
# every setting the notice says Run runs (and the notice's own words). The page's style hides it on
# the load's outputs, which carry LOAD_OUTPUT (assets/style.css): those in a closed accordion too,
# drawn when it opens. The page clicked each layer's × for 2 s before: every tracker on the page, so
# a share link refused in those 2 s lost its "Error", and none in a closed accordion
LOAD_OUTPUT = "specviz-load"
LOAD_REFUSED_JS = """() => [{__type__: 'update', interactive: true},
                           {__type__: 'update', value: NOTICE, visible: true}]""".replace(
    "NOTICE", json.dumps(LOAD_REFUSED))
TREE_PANEL_JS = """(drafter) => {
  const label = document.querySelector('#tree-panel .label-wrap');
  if (label && label.classList.contains('open') !== (drafter === 'tree')) label.click();
}"""


# A page whose run the shelf let go (visitors behind one address share its runs, and memory):
# "no run to save yet: run something first" under that run was false
LET_GO = ("the server no longer holds this page's last run (it keeps the newest {n} runs or "
          "opened traces of each address, and other pages at your address have run or opened one "
          "since, or it needed the memory): run it again")
# A page whose state the server let go (hooks.Tidy, or Gradio's expiry: some time after the page
# lost its connection, as after a laptop's sleep) may still show its run
FORGOTTEN = ("the server no longer holds this page's state or its last run (it lets a page go some time "
             "after the page lost its connection to it, as after a laptop's sleep): run it again, or "
             "reload the page")
TRACE_TTL = 3600  # seconds a page with no heartbeat (an API client over plain HTTP) keeps its state unused
# Gradio's state of a page (every output's last value) is dropped once the page has been closed
# and unused this long, and twice a job's limit (its jobs have ended; Gradio cancels a closed
# page's waiting ones), or unused for TRACE_TTL with no heartbeat (API clients over plain HTTP)
PAGE_GRACE = 600
CLEAN_CACHE = (300, 900)  # every 5 minutes, delete uploads and downloads older than 15 minutes
MAX_NOTICES = 8
NO_TEX = dict(latex_delimiters=[])  # Markdown that shows a visitor's text renders no $$...$$ as TeX
LAB_SOURCES = ("example", "round")
TREE_ONLY = ("nodes", "branching")  # settings only the token tree drafter reads
SAMPLING_ONLY = ("seed", "top_k", "top_p")  # settings a greedy run (temperature 0) never reads
SAVES = Path(tempfile.gettempdir()) / "specviz-saves"
SAVE_TTL = 300  # seconds a saved trace's file stays (Gradio copies it into its cache at once)


def pair_choices(store: ModelStore, limits: Limits) -> list[tuple[str, str]]:
    choices = [(f"{key} (command line)", key) for key in store.extra_pairs]
    for preset, why in presets.listing(limits.allow_large):
        choices.append((preset.label if why is None else f"{preset.label} — unavailable: {why}",
                        preset.key))
    if limits.allow_custom:
        choices.append(("custom: type model ids below", CUSTOM))
    return choices


QUEUE_PER_JOB = 8  # each line of Gradio's queue holds this many waiting events per model place
UPLOADS_PER_ADDRESS = 16  # uploads one public address may make while a file stays in the cache
MULTIPART_SLACK = 64 * 2**10  # an upload's body: one trace and its multipart headers
OPEN_PER_PAGE = 3  # requests one of an address's pages may hold open at once (guard.RequestGuard)
ADDRESSES_TO_EXPIRE = 16  # public addresses it takes, in an hour, to expire every page's state
MAX_BODY = 2**20  # any other request's body (the largest, a Run's, is a few KiB of settings)
MAX_BODY_VALUES = 1024  # arrays, objects and separators in one (a Run's event has about 40)
BODY_SECONDS = 60.0  # a request's body must arrive within this (an upload's 4 MiB at 70 KB/s)
QUEUE_POLL = (0.05, 0.1)  # seconds between the idle queue's looks for events, and for progress to send


def page_assets() -> dict:
    """The page's stylesheet and its script (a token's details on a tap), for demo.launch."""
    return dict(css=(ASSETS / "style.css").read_text(), js=(ASSETS / "tips.js").read_text())


def public_endpoints(demo: gr.Blocks) -> frozenset[str] | None:
    """The names `/call/v2/<name>` may call: the API page's (None: a stand-in without events)."""
    fns = getattr(demo, "fns", None)
    return None if fns is None else frozenset(f.api_name for f in fns.values()
                                              if f.api_name and f.api_visibility == "public")


def launch_options(demo: gr.Blocks) -> dict:
    """What demo.launch needs on hostile ground (main and the tests use the same)."""
    limits = demo.specviz.limits
    max_page_query = page_query_bound(limits)
    allow_long_heads(max_page_query)  # uvicorn refused such a link's head when it came in pieces
    guard = Middleware(RequestGuard, max_body=MAX_BODY, max_upload=MAX_TRACE_BYTES + MULTIPART_SLACK,
                       per_address=UPLOADS_PER_ADDRESS, upload_bytes=limits.upload_mb * 2**20,
                       window=sum(CLEAN_CACHE),  # the longest an upload stays on disk
                       deadline=BODY_SECONDS, pages=demo.specviz.pages,
                       proxies=limits.trust_forwarded, max_values=MAX_BODY_VALUES,
                       max_page_query=max_page_query,
                       upload_note=f" (one trace, and a trace opens up to {MAX_TRACE_BYTES // 2**20} MiB: "
                                   "open one that specviz saved, whose Save makes none larger)",
                       # a page holds two streams (heartbeat, results) and a few short requests
                       max_open=OPEN_PER_PAGE * demo.specviz.pages.per_address,
                       max_open_network=OPEN_PER_PAGE * demo.specviz.pages.per_network,
                       beating=getattr(demo.specviz, "beating", None),  # open pages: Tidy keeps them
                       # /call/v2/<name> looks the name up among the API page's: the public events
                       endpoints=public_endpoints(demo),
                       calls=calls_of(demo.fns) if hasattr(demo, "fns") else None,  # any event's
                       streams=(lambda session, event: stream_known(demo._queue, session, event))
                       if hasattr(demo, "_queue") else None)
    return dict(max_file_size=MAX_TRACE_BYTES, show_error=False,
                state_session_capacity=limits.max_sessions,
                run_history=False,  # its routes use the host's hub token for "local" requests
                mcp_server=False,  # GRADIO_MCP_SERVER would open routes no bound here knows
                # GRADIO_SSR_MODE (set on Spaces) would put Gradio's Node proxy in front of the app: it
                # refuses a URL over 16 KiB (431), a share link's long prompt among them
                ssr_mode=False,
                app_kwargs={"middleware": [guard]})


def notices_text(notices: list[str]) -> str:
    """Notices as Markdown: at most MAX_NOTICES, every character shown as typed."""
    shown = notices[:MAX_NOTICES] + ([f"and {len(notices) - MAX_NOTICES} more"]
                                     if len(notices) > MAX_NOTICES else [])
    return markdown_text("; ".join(shown))


# The Run tab's plots, in the order of the page's outputs (tree runs add the last two)
RUN_PLOTS = ("tokens_per_pass", "cumulative", "acceptance", "k_prediction", "time", "tree_nodes",
             "tree_chain")
SIDES_TTL = 60  # seconds a page keeps the rounds its side plots lag (the `sides` state, in build)
STOPPED = ("Stopped. What the page shows may be the stopped run's part; Save, the Exactness lab and "
           "the k explorer use your last finished run, if there is one.")
LAB_STOPPED = "<div class='specviz-lab'>Stopped.</div>"
LOADING_ELSEWHERE = "<div class='specviz-lab'>Waiting for a pair to finish loading…</div>"
LOADING_LAB = ("<div class='specviz-lab'>Loading the run's pair…</div>", gr.skip(), gr.skip(), gr.skip())
STARTED = "specviz: the job reached its GPU worker"  # in_worker's first item, never shown
SETTLED = "specviz: no load is under way in the GPU worker"  # in_worker's, once; never shown
ZEROGPU_ABORTED = "GPU task aborted"  # spaces' gr.Error for a job ZeroGPU ended (past its GPU time)
ABORTED = ("ZeroGPU ended this job before it finished: it ran past the {seconds} s of GPU time it asked "
           "for. Pick fewer new tokens (or samples) and run it again. What the page shows may be that "
           "job's part; Save, the Exactness lab and the k explorer use your last finished run, if any.")
OPEN_DURING_JOB = ("this page has a job under way (a run, the lab or the end-to-end check): press Stop "
                   "or wait for it to end, then open the trace")
# a job whose worker was still loading a pair (a large pair's read from disk can take longer than
# the load's share of the time asked; its download came before, app.fetched): fewer tokens would
# not have helped
ABORTED_LOADING = ("ZeroGPU ended this job while its worker was still loading a pair: the load ran "
                   "past the {seconds} s of GPU time the job asked for. Run it again (its files are "
                   "downloaded already, and a second read is usually faster), or pick a smaller pair.")


def stop_js(said: dict[str, str]) -> tuple[str, str, str]:
    """The browser's side of a Stop button over the jobs that show progress on the elements `said`
    names (element id -> what it says once stopped): (on the click, before the flush, after it).

    Each element says it was stopped only if its job was running (a Stop with nothing running
    wrote "Stopped" over a finished run's "Done", and the Run tab's Stop over a lab job's status
    wrote it on the run's); Gradio 6.31's tracker hides its .wrap when idle. Gradio cancels the
    jobs as the click is dispatched, but its page applies every update of theirs that reaches it,
    and those the server had queued before the cancel can reach it after /cancel has answered
    (the status said "round 22" again, for good); then the tracker shows a red "Error" pill (over
    "Stopped"). So the second function waits (10 s at most) for the stopped jobs' trackers to
    settle and then lets a Python step (`flushed`, or the Run tab's caught_up: the plots a stopped
    run left behind its headline) go through the queue: its answer comes down the page's one event
    stream behind everything the stopped jobs had queued, and lands last. The third, once it
    has (or the flush was refused: a full queue), clears the pill and says "Stopped" again, except
    where a job started since (Run pressed after Stop) shows its tracker."""
    ids, texts = json.dumps(list(said)), json.dumps(list(said.values()))
    key = json.dumps("-".join(said))
    trackers = f"""const wrap = (i) => document.querySelector(`#${{{ids}[i]}} .wrap`);
  const busy = (i) => wrap(i) !== null && !wrap(i).classList.contains("hide")
    && wrap(i).querySelector(".error") === null;  // a job's tracker showing it runs"""
    click = f"""(...shown) => {{
  {trackers}
  const running = {ids}.map((_, i) => busy(i));
  // a second Stop before the first's chain has ended adds to what it stopped: it overwrote the
  // list, and the first chain's last step (the second's is skipped: its flush is "once") then saw
  // nothing stopped and left the late updates and the "Error" pill. A list older than the chain's
  // longest wait is stale (a chain whose flush was refused never cleared it)
  const at = (window.specvizStoppedAt ??= {{}})[{key}] ?? 0;
  const before = Date.now() - at < 15000 ? (window.specvizStopped ??= {{}})[{key}] ?? [] : [];
  (window.specvizStopped ??= {{}})[{key}] = running.map((r, i) => r || Boolean(before[i]));
  window.specvizStoppedAt[{key}] = Date.now();
  return shown.map((text, i) => running[i] ? {texts}[i] : text);
}}"""
    wait = f"""async (...inputs) => {{
  const running = (window.specvizStopped ??= {{}})[{key}] ?? [];
  {trackers}
  const seen = running.map((r) => !r);  // once settled, a tracker a new job shows is not waited on
  for (let t = 0; t < 100; t++) {{
    running.forEach((_, i) => {{ seen[i] ||= !busy(i); }});
    if (seen.every(Boolean)) break;
    await new Promise((done) => setTimeout(done, 100));
  }}
  return inputs;  // the flush's own (a State's is read on the server)
}}"""
    after = f"""async (...shown) => {{
  const running = (window.specvizStopped ??= {{}})[{key}] ?? [];
  window.specvizStopped[{key}] = [];
  if (!running.some(Boolean)) return shown;
  {trackers}
  // the stopped job's last updates may still be being applied (a late one shows its tracker
  // again for a moment); a tracker still shown after 2 s is a job started since (Run pressed
  // after Stop): left to it
  for (let t = 0; t < 20 && running.some((r, i) => r && busy(i)); t++)
    await new Promise((done) => setTimeout(done, 100));
  const stopped = running.map((r, i) => r && !busy(i));
  stopped.forEach((s, i) => s && wrap(i)?.querySelector(".clear-status button")?.click());
  return shown.map((text, i) => stopped[i] ? {texts}[i] : text);
}}"""
    return click, wait, after


def flushed() -> None:
    """The lab Stop's step through the queue, after the stopped jobs' cancel: see stop_js (the Run
    tab's makes the plots a stopped run left behind its headline: caught_up)."""


def link_notice(notices: list[str]) -> str:
    return "⚠ " + notices_text(notices)


def checked_examples(demo: gr.Blocks, examples: gr.Examples) -> None:
    """Gradio's loader of an example (`/run/load_example`, outside the queue) indexes the list with
    whatever a call sends: None, a string or an index past it raised there, and each such call
    logged a 2.3 KB traceback (22 KB/s from one client). It now refuses them with a message, and
    logs nothing."""
    fn, samples = demo.fns[examples.load_input_event["id"]], examples.dataset.raw_samples
    load, n = fn.fn, len(samples)

    def checked(index):  # what the Dataset's preprocess took: its index
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise gr.Error(f"pick one of the {n} examples (an index in 0..{n - 1})", print_exception=False)
        return load((index, samples[index]))  # as gr.Dataset(type="tuple").preprocess gives it

    assert examples.dataset.type == "tuple" and fn.inputs == [examples.dataset]
    fn.fn, fn.preprocess = checked, False  # the index checked before it is read


def user_error(e: BaseException) -> gr.Error:
    """A ValueError's message for any visitor: no server paths, no HTML, no bidirectional control
    obeyed (a custom model's name is echoed as typed: its U+202E turned the rest of the toast)."""
    return gr.Error(html.escape(visible_bidi(public_message(str(e))), quote=False), print_exception=False)


def error_outputs(e: gr.Error, n: int, at: int = 0, markdown: bool = True):
    """n outputs that keep what the page shows, but output `at` (the event's status) says e's
    message as plain text: Gradio's toast goes after seconds, and the status under its Error pill
    said what the job had said last ("Loading tiny…", "round 6", "Opened: …" a trace before).
    One output is the value itself, as Gradio takes it."""
    message = "⚠ " + html.unescape(e.message)  # a user_error's is escaped once, for the toast
    shown = markdown_text(message) if markdown else f"<div class='specviz-lab'>{html.escape(message)}</div>"
    return shown if n == 1 else tuple(shown if i == at else gr.skip() for i in range(n))


def said_on_error(stream, n: int, at: int = 0, markdown: bool = True):
    """An event's outputs from stream; on a gr.Error, first the outputs that say it on the event's
    status (error_outputs), then the error itself (Gradio's toast)."""
    try:
        yield from stream
    except gr.Error as e:
        yield error_outputs(e, n, at, markdown)
        raise


def visitor_error(e: BaseException) -> gr.Error | None:
    """What a visitor is told of e: a ValueError's message (user_error), or the fix for running out
    of memory; None for anything else (raised as it is, a gr.Error too)."""
    if isinstance(e, gr.Error):
        return None
    if isinstance(e, ValueError):
        return user_error(e)
    if out_of_memory(e):
        return gr.Error("out of memory: pick a smaller pair or fewer new tokens", print_exception=False)
    return None


def on_gpu(seconds):
    """zerogpu.gpu for a generator job (seconds: a number, or a function of the job's arguments),
    a visitor's ValueError, and running out of memory, turned into gr.Error inside it:
    ZeroGPU's worker hands back only a gr.Error whole, and any other exception as "ZeroGPU worker
    error", so the message naming the fix (a prompt too long, a pair switch refused) was lost."""
    def wrap(job):
        def inside(*args, **kwargs):
            try:
                yield from job(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - re-raised as it is unless a visitor's
                if (shown := visitor_error(e)) is None:
                    raise
                raise shown from None
        return zerogpu.gpu(seconds)(inside)
    return wrap


def session_of(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None


def build(store: ModelStore, limits: Limits, default: RunSettings) -> gr.Blocks:
    default = limits.fit(default)  # an operator's lower bounds apply to the defaults too
    store.home = store.key(default)  # the page's own pair: a switch back to it is never refused
    gate = Gate(limits.queue_size, stale_after=max(900.0, 3 * limits.max_job_seconds),
                per_address=limits.jobs_per_address)
    shelf = Shelf(limits.held_trace_mb * 2**20, per_address=limits.jobs_per_address)
    downloads = Gate(limits.queue_size, stale_after=gate.stale_after, per_address=limits.jobs_per_address)

    def visitor(request: gr.Request | None) -> str | None:
        return request_address(request, limits.trust_forwarded)

    with gr.Blocks(title="specviz: speculative decoding, visible", delete_cache=CLEAN_CACHE) as demo:
        per_page = max(4, limits.max_sessions // ADDRESSES_TO_EXPIRE)  # an IPv6 /48: a quarter of all
        pages = PerAddress(per_page, TRACE_TTL, per_network=max(per_page, limits.max_sessions // 4))
        opens = PerAddress(UPLOADS_PER_ADDRESS, sum(CLEAN_CACHE),  # traces opened, by address (each
                           "too many traces opened from your address: at most {n} in {minutes} minutes; "
                           "wait a few minutes and try again",
                           per_network=2 * UPLOADS_PER_ADDRESS)  # costs up to seconds of a core)
        # sessions whose heartbeat stream is connected (RequestGuard counts them): a page open in a
        # browser keeps its state however long its visitor is away (TRACE_TTL is for pages with no
        # heartbeat: clients calling the API over plain HTTP); one back at an open tab after an hour
        # was told "run something first" under its run
        beating = Counter()
        tidy = Tidy(lambda: getattr(demo, "state_holder", None), idle=TRACE_TTL,  # Gradio's, once launched
                    closed=max(PAGE_GRACE, 2 * limits.max_job_seconds), files=sum(CLEAN_CACHE),
                    cache=get_upload_folder(),  # where Gradio's File puts uploads (its GRADIO_CACHE)
                    open_pages=beating)
        demo.specviz = SimpleNamespace(gate=gate, shelf=shelf, store=store, limits=limits, pages=pages,
                                       default=default, tidy=tidy, beating=beating)
        gr.Markdown(INTRO)
        notice = gr.Markdown(visible=False, elem_classes=["specviz-notice", LOAD_OUTPUT], **NO_TEX)
        # a key on the shelf, freed with the page's state (hooks.Tidy: a page closed and unused for
        # PAGE_GRACE, or unused for TRACE_TTL with no heartbeat; Gradio: a closed page an hour after
        # the key was set): no time to live of its own, which Gradio counts from when the key was
        # set, so a page in use an hour after its last run lost it and was told "run something first"
        last = gr.State(None, delete_callback=shelf.drop)
        # the rounds of the headline plot the page shows, while the plots beside it are older
        # (service.View.sides: they come every 10 s): a run that ends before its finished view (Stop,
        # an error) makes them anew, and every plot then shows the same rounds. Set only as a view
        # reaches the page: a Stop discards the view its job was making. Kept SIDES_TTL after its
        # last update: the Stop's step reads it within 10 s; one a cancelled run left without that
        # step (an API client's /cancel, a closed page) held its rounds (2-24 KB a tree round here:
        # docs/rounds-memory.py) outside the shelf's budget for as long as Gradio kept the page. A
        # closed page's values Gradio keeps an hour, whatever their time to live: the page's unload
        # drops it (free_session)
        sides = gr.State(None, time_to_live=SIDES_TTL)
        # a phone shows every tab, wrapped onto a second line if need be: the default "menu" hid the
        # last two behind "..." on a page opened at 360-390 px
        with gr.Tabs(overflow_behavior="wrap"):
            with gr.Tab("Run") as run_tab, gr.Row():
                with gr.Column(scale=1, min_width=320):
                    pair = gr.Dropdown(pair_choices(store, limits), value=default.pair, label="Pair")
                    with gr.Row(visible=limits.allow_custom):
                        target = gr.Textbox(default.target, label="Custom target (hub id or path)")
                        draft = gr.Textbox(default.draft, label="Custom draft (optional)")
                    proposer = gr.Radio([("draft model", "draft"), ("n-gram lookup", "ngram"),
                                         ("hybrid (n-gram, else draft)", "hybrid"),
                                         ("adaptive k", "adaptive"), ("token tree", "tree"),
                                         ("none (baseline)", "none")],
                                        value=default.proposer, label="Drafter")
                    k = gr.Slider(1, UI_MAX_K, value=default.k, step=1,
                                  label="k (tokens drafted per round; the token tree's depth)")
                    with gr.Accordion("Token tree (the 'token tree' drafter only)", open=False):
                        nodes = gr.Slider(0, MAX_NODES, value=default.nodes, step=1,
                                          label="tree nodes per round (token tree only)",
                                          info="0 sizes each round's tree from the measured verify cost")
                        branching = gr.Slider(0, MAX_BRANCHING, value=default.branching, step=1,
                                              label="tree branching (token tree only)",
                                              info="children of each expanded node; 0 starts at 3 and "
                                                   "widens while the tree fills")
                    with gr.Accordion("Sampling", open=False):
                        temperature = gr.Slider(0, 2, value=default.temperature, step=0.05,
                                                label="temperature (0 = greedy)")
                        top_p = gr.Slider(0.05, 1, value=default.top_p, step=0.05, label="top-p")
                        top_k = gr.Number(default.top_k, precision=0, minimum=0, label="top-k (0 = off)")
                        seed = gr.Number(default.seed, precision=0, label="seed")
                        dtype = gr.Dropdown(list(limits.dtypes), value=default.dtype, label="dtype")
                    max_new_tokens = gr.Slider(1, limits.max_new_tokens, step=1, label="max new tokens",
                                               value=min(default.max_new_tokens, limits.max_new_tokens))
                    # the browser counts a prompt's UTF-16 units (an emoji is two), the server its
                    # characters: a box of max_prompt_chars cut a pasted prompt the server takes
                    # silently. Twice that lets each through, and one longer is refused with the fix
                    prompt = gr.Textbox(default.prompt, lines=5, max_length=2 * limits.max_prompt_chars,
                                        label="Prompt", elem_id="prompt")
                    chat = gr.Checkbox(default.chat, label="apply the chat template (instruct models)")
                    examples = gr.Examples([[e["prompt"], e["chat"]] for e in EXAMPLES], [prompt, chat],
                                           example_labels=[e["label"] for e in EXAMPLES])
                    checked_examples(demo, examples)
                    with gr.Row():
                        # until the page's load has set a link's settings: a Run clicked before
                        # it ran the defaults, under the link's settings once they came
                        run_btn = gr.Button("Run", variant="primary", elem_id="run", interactive=False)
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                    link_btn = gr.Button("Copy link to these settings", size="sm", elem_id="copy-link")
                    link = gr.Textbox(label="Share link", interactive=False, elem_id="share-link",
                                      info="the button copies it to your clipboard too, where the browser "
                                           "allows")
                with gr.Column(scale=2):
                    status = gr.Markdown("Pick settings and press **Run**.", elem_id="status", **NO_TEX)
                    gr.HTML(legend_html())
                    text = gr.HTML(elem_id="tokens")
                    verdict = gr.HTML(elem_id="verdict")
                    stats = gr.HTML(elem_id="stats")
                    # open while the drafter is the token tree: on chain runs it held only a note
                    with gr.Accordion("Token tree", open=default.proposer == "tree", elem_id="tree-panel"):
                        tree_view = gr.HTML(treeview.chain_html(), elem_id="tree", css_template=treeview.CSS)
                        tree_slider = gr.Slider(1, 2, value=1, step=1, label="round (playback)",
                                                visible=False, elem_id="tree-round")
                        tree_overview = gr.HTML(elem_id="tree-overview", css_template=treeview.CSS)
                        with gr.Row():
                            fig_tree_nodes = gr.Plot(label="accepted against nodes", visible=False)
                            fig_tree_chain = gr.Plot(label="tree against chain", visible=False)
                    with gr.Row():
                        fig_tpp = gr.Plot(label="tokens per pass", elem_id="fig-tpp")
                        fig_cum = gr.Plot(label="cumulative")
                    with gr.Row():
                        fig_acc, fig_k = gr.Plot(label="acceptance"), gr.Plot(label="k")
                    fig_time = gr.Plot(label="time")
                    with gr.Accordion("Round timeline", open=False):
                        timeline = gr.HTML(elem_id="timeline")
                    rerun32 = gr.Button("Re-run in float32 (checks a near-tie)", size="sm")
            with gr.Tab("Exactness lab") as lab_tab:
                gr.Markdown(LAB_INTRO)
                with gr.Row():
                    lab_source = gr.Radio([("built-in example (A, B, C)", "example"),
                                           ("a round of the last run", "round")], value="example",
                                          label="Distributions")
                    lab_round = gr.Number(1, precision=0, minimum=1, label="round")
                    lab_trials = gr.Slider(1_000, 1_000_000, value=200_000, step=1_000, label="trials N",
                                           elem_id="lab-trials")
                lab_variants = gr.CheckboxGroup([(v + ": " + d, v) for v, d in lab.VARIANTS.items()],
                                                value=list(lab.VARIANTS), label="variants to run")
                with gr.Row():
                    lab_btn = gr.Button("Show masses and run the Monte Carlo check", variant="primary",
                                        elem_id="lab-run", scale=4)
                    lab_stop = gr.Button("Stop", variant="stop", elem_id="lab-stop", scale=1)
                lab_info = gr.HTML(elem_id="lab-info")
                with gr.Row():
                    lab_masses = gr.Plot(label="masses", elem_id="lab-masses")
                    lab_mc = gr.Plot(label="Monte Carlo", elem_id="lab-mc")
                lab_table = gr.HTML(elem_id="lab-table")
                e2e_title = "End to end: sample short continuations with the Run tab's pair"
                with gr.Accordion(e2e_title, open=False):
                    e2e_n = gr.Slider(10, limits.max_samples, value=min(50, limits.max_samples), step=10,
                                      label="samples per method")
                    e2e_btn = gr.Button(f"Sample short continuations (min(k, {E2E_MAX_DRAFTS}) + 1 tokens), "
                                        "speculative and target alone")
                    e2e_out = gr.HTML(elem_id="e2e-out")
            with gr.Tab("k explorer") as explorer_tab:
                gr.Markdown(EXPLORER_INTRO)
                with gr.Row():
                    ex_k = gr.Slider(1, UI_MAX_K, value=4, step=1, label="k")
                    ex_adaptive = gr.Checkbox(False, label="adaptive-k policy instead")
                    ex_profile = gr.Dropdown(
                        [("recorded costs (this run)", "")]
                        + [(profiles.load_shipped(n).label, n) for n in profiles.shipped()],
                        value="", label="project onto a cost profile")
                ex_numbers = gr.HTML(EXPLORER_EMPTY, elem_id="explorer-numbers")
                ex_text = gr.HTML(elem_id="explorer-tokens")
                ex_plot = gr.Plot(label="every k")
            with gr.Tab("Save / open"):
                gr.Markdown("Save the last run as a JSON trace (settings, rounds, stats, recording), or "
                            "open one to replay it here without any model: see docs/trace-format.md.")
                save_btn = gr.Button("Save the last run as a trace")
                # Gradio's cleaner deletes the file it serves CLEAN_CACHE[1] seconds after the Save
                save_file = gr.File(label=f"trace (download it within {CLEAN_CACHE[1] // 60} minutes; Save "
                                          "again for a new link)", interactive=False)
                open_file = gr.File(label="open a trace (.json)", file_types=[".json"], type="filepath")
                replay_status = gr.Markdown(elem_id="replay-status", **NO_TEX)

        controls = [pair, target, draft, proposer, k, temperature, top_p, top_k, seed,
                    max_new_tokens, prompt, chat, dtype, nodes, branching]
        names = ["pair", "target", "draft", "proposer", "k", "temperature", "top_p", "top_k", "seed",
                 "max_new_tokens", "prompt", "chat", "dtype", "nodes", "branching"]
        assert sorted(names) == sorted(SETTING_NAMES)
        for control in controls:  # the page's load sets them: a refused load's "Error" over them is
            control.elem_classes = [*(control.elem_classes or []), LOAD_OUTPUT]  # hidden (LOAD_OUTPUT)
        demo.specviz.names = tuple(names)  # the order of the controls, the link and the API's /run
        outputs = [status, text, verdict, stats, timeline, fig_tpp, fig_cum, fig_acc, fig_k, fig_time,
                   tree_view, tree_slider, tree_overview, fig_tree_nodes, fig_tree_chain, sides, last]
        plot_outputs = dict(zip(RUN_PLOTS, (fig_tpp, fig_cum, fig_acc, fig_k, fig_time, fig_tree_nodes,
                                            fig_tree_chain), strict=True))

        def settings_of(values) -> RunSettings:
            if len(values) != len(names):
                raise ValueError(f"expected {len(names)} settings ({', '.join(names)}), got {len(values)}")
            return settings_from(dict(zip(names, values, strict=True)), limits)

        def in_use(request) -> None:
            """The page is in use: a closed one keeps its state (its run) for as long as it is used
            (keep_closed_page)."""
            keep_closed_page(getattr(demo, "state_holder", None), session_of(request))

        def held(session) -> bool:
            """The page has a job waiting or running: in the model's line, or in the download line
            that comes before it on ZeroGPU."""
            return gate.holds(session) or downloads.holds(session)

        def gated(request, waiting, job):
            """Run job() (a generator of outputs) once the gate lets this visitor's ticket through;
            while waiting, yield waiting(jobs ahead) so the page shows it and Stop can act."""
            tidy()  # pages gone (API clients close none)
            in_use(request)
            try:
                if downloads.holds(session_of(request)):  # a job of this page's downloads first
                    raise Busy(BUSY)
                with gate.ticket(session_of(request), visitor(request)) as ticket:
                    for ahead in ticket.waiting():
                        yield waiting(ahead)
                    for out in job():
                        ticket.touch()
                        yield out
            except gr.Error:
                raise
            except Exception as e:  # noqa: BLE001 - re-raised as it is unless a visitor's
                if (shown := visitor_error(e)) is None:
                    raise
                raise shown from None

        def fetched(s: RunSettings, waiting, request):
            """On ZeroGPU, download what s's pair loads and is not cached (store.fetching) before a
            place in the model's line and the GPU time the job asks for: a first use's download
            ran inside the job, on the visitor's GPU seconds (a large preset's outlasted the 60 s
            asked for a load), and held every visitor's place in line meanwhile. Downloads have
            a line of their own, one at a time, with the model line's bounds on what a visitor
            holds. waiting(text) is what the page shows meanwhile. Elsewhere nothing."""
            try:
                if not zerogpu.active() or not any(map(needs_fetch, store.model_names(s))):
                    return
                if gate.holds(session_of(request)):  # a job of this page's in the model's line
                    raise Busy(BUSY)
                with downloads.ticket(session_of(request), visitor(request)) as ticket:
                    for ahead in ticket.waiting():
                        yield waiting(f"waiting for the downloads asked for before yours: {ahead} ahead "
                                      "of you (Stop leaves the line)")
                    for item in store.fetching(s, waiting):
                        ticket.touch()
                        yield item
            except ValueError as e:
                raise user_error(e) from None

        def wait_text(ahead: int) -> str:
            return f"waiting for the model: {ahead} ahead of you (Stop leaves the line)"

        def tree_outputs(view: View, final: bool) -> list:
            """The tree panel: the round's tree, the playback slider (usable once the run is kept),
            the overview and the tree plots; a chain run shows only the note."""
            if not view.is_tree:
                hidden = gr.update(visible=False)
                return [view.tree_html, hidden, gr.update(value="", visible=False), hidden, hidden]
            rounds = len(view.spec.events)  # one round: no playback (a slider needs two ends, and
            slider = gr.update(visible=rounds > 1, minimum=1, maximum=max(rounds, 2),  # offered 2)
                               value=view.tree_round or rounds, interactive=final)
            f = view.figures
            plots = [gr.update(value=f[name], visible=True) if name in f else gr.skip()
                     for name in ("tree_nodes", "tree_chain")]
            overview = gr.update(visible=True) if view.tree_overview is None else \
                gr.update(value=view.tree_overview, visible=True)  # None: the page keeps its own
            return [view.tree_html, slider, overview, *plots]

        def status_only(status: str) -> tuple:
            return (status, *(gr.skip() for _ in outputs[1:]))

        def show(view: View, request, final: bool | None = None):
            if view.spec is None:  # loading, reading the prompt: the page keeps the last run whole
                # (a loading view blanked its text and counters but not its plots or tree panel,
                # and an error or Stop then left half a run under a status about another)
                return status_only(view.status)
            f = view.figures
            key = shelf.put(session_of(request), view.trace, address=visitor(request)) \
                if view.trace is not None else gr.skip()
            shown = [f.get(name, gr.skip()) for name in RUN_PLOTS[:5]]
            final = view.trace is not None if final is None else final
            timeline = gr.skip() if view.timeline_html is None else view.timeline_html  # as the plots
            return (view.status, view.text_html, view.verdict_html, view.stats_html,
                    timeline, *shown, *tree_outputs(view, final), view.sides if f else gr.skip(), key)

        # the Sides whose plots a Stop's step (or a failed job) has made: each is made once. The step
        # runs at once (concurrency_limit=None), reading the page's `sides` as it starts, and anyone
        # can send it by its index: a dozen sent together made every plot a dozen times (0.3 s
        # each for a 93-round tree run here), again at each view of a run of their own
        plotted = weakref.WeakSet()
        catching = threading.Lock()

        def caught_up(behind: Sides | None, request: gr.Request = None) -> dict:
            """{output: value}: every plot of the rounds the page's headline shows (behind: the
            rounds the plots beside it lag), the first time these rounds are asked for, and `sides`
            cleared; nothing where the page has moved on while they were made."""
            with catching:
                fresh = behind is not None and behind not in plotted
                if fresh:
                    plotted.add(behind)
            made = behind.figures() if fresh else {}
            # Run pressed just after Stop: the new run's first view (every plot) set `sides` while
            # these were made, and they landed over its plots, older, until its next side plots
            if page_value(getattr(demo, "state_holder", None), session_of(request), sides._id,
                          behind) is not behind:
                return {sides: gr.skip()}
            return {plot_outputs[name]: figure for name, figure in made.items()} | {sides: None}

        def job_limits(kind: str, *args) -> Limits:
            """limits, with the job's clock inside the GPU time it asked for on ZeroGPU (the time a
            load takes is not on the clock, which starts once the pair is loaded)."""
            if not zerogpu.active():
                return limits
            seconds = zerogpu.job_seconds(asked(kind, *args, load=False))
            return replace(limits, max_job_seconds=min(limits.max_job_seconds, seconds))

        def run_job(s: RunSettings):  # a run, its baseline (a tree run: and the chain)
            yield from run_views(store, s, job_limits("run", s))  # plain values cross back from ZeroGPU

        def run_stream(values, request, dtype=None):
            try:
                s = settings_of(values)
                s = replace(s, dtype=dtype) if dtype else s
                s.check(limits, store.known_pairs)  # before a gate place and the GPU time it asks for
            except ValueError as e:
                raise user_error(e) from None
            yield from fetched(s, lambda text: status_only(markdown_text(text)), request)

            def job():
                behind = None  # the page's `sides`, as this job last set it
                try:
                    for view in on_gpu_job("run", s):
                        behind = view.sides if view.figures else behind
                        yield show(view, request)  # the shelf lives in this process
                except Exception:  # an error, ZeroGPU's limit (a Stop is the page's: caught_up)
                    try:
                        caught = caught_up(behind, request) if behind is not None else None
                    except Exception:  # noqa: BLE001 - the plots failing too (out of memory again):
                        caught = None  # the job's own error is what the visitor is told
                    if caught is not None:
                        yield tuple(caught.get(output, gr.skip()) for output in outputs)
                    raise

            yield from gated(request, lambda ahead: status_only(wait_text(ahead)), job)

        # gr.Request and gr.Progress are injected by position: they come before the settings, which
        # are named so that the API lists them by name (as `param_0`... under *values)
        def run(request: gr.Request, progress=gr.Progress(track_tqdm=True), pair=None, target=None,
                draft=None, proposer=None, k=None, temperature=None, top_p=None, top_k=None, seed=None,
                max_new_tokens=None, prompt=None, chat=None, dtype=None, nodes=None, branching=None):
            yield from said_on_error(run_stream((pair, target, draft, proposer, k, temperature, top_p, top_k,
                                                 seed, max_new_tokens, prompt, chat, dtype, nodes, branching),
                                                request), len(outputs))

        def auto_run(request: gr.Request, progress=gr.Progress(track_tqdm=True), autorun=False, *values):
            if autorun is not True:  # only a run=1 link sets it (on_load)
                yield tuple(gr.skip() for _ in outputs)
                return
            yield from said_on_error(run_stream(values, request), len(outputs))

        def rerun_float32(request: gr.Request, progress=gr.Progress(track_tqdm=True), key=None, *values):
            yield from said_on_error(rerun_stream(key, values, request), len(outputs))

        def rerun_stream(key, values, request):
            try:
                page = settings_of(values)
                # the settings' own errors first, in float32 (a 7-8B pair needs twice the memory)
                replace(page, dtype="float32").check(limits, store.known_pairs)
                last_run = kept_run(key, "run first: this button runs the page's settings again in "
                                    "float32 after a run, to check a near-tie (float32 runs are slower)",
                                    request)
                if page.temperature > 0:  # a sampled run has no near-tie to check
                    raise ValueError("a float32 rerun checks a greedy run's near-tie, and these settings "
                                     "sample (temperature above 0): set temperature 0 and press Run, or pick "
                                     "float32 under dtype to run them in float32")
                if last_run.models.get("dtype") in WIDE:  # the same run again, minutes for nothing
                    raise ValueError(f"the last run was in {last_run.models['dtype']} already: a "
                                     "float32 rerun checks a near-tie of a bfloat16 or float16 run. "
                                     "To run new settings in float32, pick float32 under dtype and press Run")
                # other settings than the last run's: it said "identical" of a run never made in bf16
                ran = getattr(last_run, "settings", None)
                # what the run never read is no change: a chain's tree settings (a trace from before
                # trees lacks them), and at temperature 0 (checked above) the seed and the cuts,
                # which leave the argmax where it is
                chain = isinstance(ran, dict) and ran.get("proposer") != "tree" and page.proposer != "tree"
                unread = {*TREE_ONLY, *SAMPLING_ONLY} if chain else set(SAMPLING_ONLY)
                changed = [name for name, value in asdict(page).items() if name != "dtype" and name not in
                           unread and (not isinstance(ran, dict) or ran.get(name) != value)]
                if changed:
                    raise ValueError(f"the page's settings changed since the last run "
                                     f"({', '.join(changed)}): this button checks the last run again in "
                                     "float32. Press Run first, or pick float32 under dtype and press Run")
            except ValueError as e:
                raise user_error(e) from None
            yield from run_stream(values, request, dtype="float32")

        def control_values(s: RunSettings) -> list:
            values = [getattr(s, n) for n in names]  # the pair menu's labels as they stand now (a
            # model cached since start-up, a hub gone quiet): the probe is kept a minute
            values[names.index("pair")] = gr.update(choices=pair_choices(store, limits), value=s.pair)
            return values

        def on_load(request: gr.Request):
            params = request.query_params if request else {}  # starlette's: every repeat too
            params = params if hasattr(params, "multi_items") else dict(params)
            s, notices, autorun = from_query(params, default, limits, store.known_pairs)
            shown = gr.update(value=link_notice(notices), visible=True) if notices else \
                gr.update(visible=False)
            return (*control_values(s), shown, autorun, gr.update(interactive=True))

        def share_query(*values):
            try:
                s = settings_of(values)
                s.check(limits, store.known_pairs)  # what a Run refuses, a link opens without
                yield s.to_query()
            except (TypeError, ValueError) as e:
                yield ""  # the box kept the last link: of settings the page no longer has
                raise user_error(ValueError(f"cannot make a link: {e}")) from None

        def pair_changed(key):
            if isinstance(key, str) and key == default.pair and key not in presets.BY_KEY:
                return gr.update(value=default.chat)  # the page's own (command-line) pair: its switch
            preset = presets.BY_KEY.get(key) if isinstance(key, str) else None
            return gr.update(value=preset.chat) if preset else gr.skip()

        def lab_run(source, round_number, trials, variants, key, request: gr.Request):
            yield from said_on_error(lab_stream(source, round_number, trials, variants, key, request), 4,
                                     markdown=False)

        def lab_stream(source, round_number, trials, variants, key, request):
            try:
                if source not in LAB_SOURCES:
                    raise ValueError(f"distributions must be one of {', '.join(LAB_SOURCES)}")
                trials = coerce_int("trials", trials, 1_000, 1_000_000)
                if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
                    raise ValueError("variants must be a list of variant names: "
                                     f"{', '.join(lab.VARIANTS)}")
                variants = [v for v in variants if v in lab.VARIANTS][: len(lab.VARIANTS)]
                trace = None
                if source == "round":
                    round_number = coerce_int("round", round_number, 1, 1_000_000)
                    trace = kept_run(key, "no run yet: run something first, or use the example", request)
            except ValueError as e:
                raise user_error(e) from None

            lab_status = lambda text: (f"<div class='specviz-lab'>{text}</div>",  # noqa: E731
                                       gr.skip(), gr.skip(), gr.skip())
            if (wanted := trace_pair(trace)) is not None:
                yield from fetched(wanted, lambda text: lab_status(html.escape(text)), request)
            waiting = lambda ahead: lab_status(wait_text(ahead))  # noqa: E731
            # the built-in example uses no model: no GPU time asked (nor refused) for it
            yield from gated(request, waiting,
                             lambda: on_gpu_job("lab", source, trace, round_number, trials, variants)
                             if source == "round" else lab_job(source, trace, round_number, trials, variants))

        def trace_pair(trace) -> RunSettings | None:
            """On ZeroGPU, the settings that load the pair a run's trace was made with (its pair,
            names and dtype), where this deployment offers them; else None. There a job's worker
            is not chosen: a fresh one holds the page's pair, and the lab, reading the loaded pair,
            refused a round of a run on another pair whatever the visitor did ("run it here
            first"). Elsewhere the lab reads the loaded pair and never switches it."""
            ran = getattr(trace, "settings", None)
            if not zerogpu.active() or not isinstance(ran, dict):
                return None
            s, _ = from_trace(ran, default, limits, store.known_pairs)
            if any(ran.get(name) != getattr(s, name) for name in (
                    ("pair", "dtype", "target", "draft") if s.pair == CUSTOM else ("pair", "dtype"))):
                return None  # a setting this deployment refuses: the page's own would stand in
            made = trace.models if isinstance(trace.models, dict) else {}
            target = next(iter(store.model_names(s)), None) or embedded.TARGET.title
            if made.get("dtype") != store.key(s)[-1] or made.get("target") != public_message(target):
                return None  # its settings name another pair or dtype than made it (an edited file,
                # an "auto" another device read as float16): a load, then "run it here first"
            try:
                s.check(limits, store.known_pairs)
            except ValueError:
                return None
            return s

        def lab_job(source, trace, round_number, trials, variants):
            if source == "round":
                begun = time.monotonic()  # a wait counts: on ZeroGPU it spends the GPU time asked
                if (wanted := trace_pair(trace)) is not None:  # ZeroGPU: the run's own pair
                    pair = yield from store.loading(wanted, LOADING_LAB)
                    begun = time.monotonic()  # its load has GPU time of its own (gpu_seconds)
                else:  # the pair loaded, once a load under way (a stopped job's) ends
                    pair = yield from store.settled((LOADING_ELSEWHERE, gr.skip(), gr.skip(), gr.skip()))
                steps = labview.from_round_steps(
                    pair, trace, round_number, limits.max_prompt_tokens + limits.max_new_tokens,
                    limits.max_prompt_tokens, deadline=begun + job_limits("lab").max_job_seconds)
                while True:  # a long context is read a pass at a time: Stop acts between them
                    try:
                        text = next(steps)
                    except StopIteration as done:
                        p, q, labels, drafted, note = done.value
                        break
                    yield (f"<div class='specviz-lab'>{html.escape(text)}</div>", gr.skip(), gr.skip(),
                           gr.skip())
                tok = pair.tokenizer
                candidates = labview.tree_root(trace, round_number) or None  # a tree round's own
            else:
                (p, q, labels, drafted), note, tok = labview.example(), "built-in example", None
                candidates = None
            label = labview.token_name(drafted, labels, tok)
            mc, table = labview.monte_carlo(p, q, labels, trials, variants, tokenizer=tok,
                                            candidates=candidates)
            yield (labview.masses_html(p, q, drafted, label, note),
                   labview.masses_figure(p, q, labels, tok), mc, table)

        def e2e_run(request: gr.Request, n=None, *values):
            yield from said_on_error(e2e_stream(n, values, request), 1, markdown=False)

        def e2e_stream(n, values, request):
            try:
                n = coerce_int("samples", n, 10, limits.max_samples)
                s = settings_of(values)
                s.check(limits, store.known_pairs)
                check_continuations(s, n, limits)
            except ValueError as e:
                raise user_error(e) from None
            yield from fetched(s, lambda text: f"<div class='specviz-lab'>{html.escape(text)}</div>", request)
            yield from gated(request, lambda ahead: f"<div class='specviz-lab'>{wait_text(ahead)}</div>",
                             lambda: on_gpu_job("e2e", s, n))

        def e2e_job(s, n):
            pair = yield from store.loading(s, "<div class='specviz-lab'>Loading the pair…</div>")
            for step in continuations(pair, s, n, job_limits("e2e", s, n)):
                if "stopped" in step:
                    yield f"<div class='specviz-lab'>{html.escape(step['stopped'])}</div>"
                elif not step.get("final"):
                    yield (f"<div class='specviz-lab'>Sampling: {step['done']} of {step['of']} "
                           "samples…</div>")
                else:
                    yield labview.continuations_html(step)

        # Every GPU job goes through one function, decorated once: spaces.GPU keeps a worker
        # process per decorated function (and GPU) for its next call. Decorated per request, each
        # job forked a fresh worker (its CUDA set-up and weights) and kept it; decorated a job kind
        # each, the run, the lab and the check had a worker each, and so a model store each (the
        # lab's never held the pair a run had switched to). A job's settings reach the worker as
        # arguments (pickled), and its GPU time is a function of them, a load counted in where it
        # may need one. Which worker a call gets is not known when it asks: spaces reuses a GPU's
        # last worker only where the scheduler finds it idle on the GPU it picks, else forks a fresh
        # one from this process, which holds the page's pair. So a job asks for a load's time
        # wherever it asks for another pair or dtype than the page's, and for none on the page's:
        # a worker holding another switches back without a load (the store keeps the page's pair on
        # ZeroGPU: spaces holds its tensors on the GPU in every worker anyway). Tracking one worker's
        # pair, a job on another GPU's fresh worker asked for a load it never made, and one back
        # on a worker it had not tracked loaded with no time asked for it. A job stopped while its
        # worker loaded leaves that load going on there (a job there waits for it): every job for a
        # load's time after it asks for that time too, the lab's among them, whatever became of
        # the calls between (one spaces refused reached no worker).
        jobs = {"run": run_job, "lab": lab_job, "e2e": e2e_job}
        worker = {"unsettled": float("-inf"), "asked": 0}  # when a job stopped mid-load; the last ask

        def asked(kind: str, *args, load: bool) -> int:
            if kind == "lab":  # a round's context read, one pass a model, and the sampling
                return zerogpu.LAB_SECONDS + zerogpu.LOAD_SECONDS * load
            s = args[0]
            if kind == "e2e":  # n samples of min(k, 4) + 1 tokens (e2e_tokens), speculative and alone
                return zerogpu.duration(e2e_tokens(s) * args[1], load=load)
            return zerogpu.duration(s.max_new_tokens, runs=3 if s.proposer == "tree" else 2, load=load)

        def gpu_seconds(kind: str, *args) -> int:
            waits = time.monotonic() - worker["unsettled"] < zerogpu.LOAD_SECONDS  # on that load
            wanted = trace_pair(args[1]) if kind == "lab" else args[0]  # the lab: its run's pair
            load = (wanted is not None and store.key(wanted) != store.home) or waits
            worker["asked"] = asked(kind, *args, load=load)
            return worker["asked"]

        @on_gpu(gpu_seconds)
        def in_worker(kind: str, *args):
            yield STARTED  # the job reached its worker (on_gpu_job)
            settled = False
            for item in jobs[kind](*args):
                if not settled and not store.load_under_way():
                    settled = True
                    yield SETTLED
                yield item

        def on_gpu_job(kind: str, *args):
            job, started, settled = in_worker(kind, *args), False, False
            try:
                started = next(job) == STARTED
                for item in job:
                    if isinstance(item, str) and item == SETTLED:
                        settled = True
                    else:
                        yield item
            except GeneratorExit:  # Stop: spaces keeps the worker, a load under way going on there
                if not settled:
                    worker["unsettled"] = time.monotonic()
                raise
            except BaseException as e:
                if isinstance(e, gr.Error) and e.message == ZEROGPU_ABORTED:
                    why = ABORTED if settled or not started else ABORTED_LOADING
                    raise gr.Error(why.format(seconds=worker["asked"]), print_exception=False) from None
                raise

        def held_run(key, request):
            """The run the page's key names; else the run the page's session holds: where the key
            went with the page's state and the run stayed (Gradio pushes its oldest pages out
            without their delete callbacks), or where the key names a run this page's newer one
            replaced on the shelf but never reached the page (a Stop during that run's last step:
            Gradio then drops the step's outputs, the new key among them)."""
            in_use(request)
            trace = shelf.get(key) if key is not None else None
            return trace if trace is not None else shelf.of_session(session_of(request))

        def gone(key, request) -> str | None:
            """Why a page that may still show a run has none on the shelf: LET_GO where the shelf
            let its run go, FORGOTTEN where the page's state went with it; else None."""
            if shelf.let_go(key):
                return LET_GO.format(n=shelf.per_address)
            if key is None and shelf.forgot(session_of(request)):
                return FORGOTTEN
            return None

        def kept_run(key, missing: str, request=None):
            """The run the page's key names (held_run); else ValueError: `missing` on a page that
            has had none, why it is gone (gone) on one that may still show it."""
            trace = held_run(key, request)
            if trace is None:
                raise ValueError(gone(key, request) or missing)
            return trace

        def explore(k_value, adaptive, profile, key, request: gr.Request = None):
            try:
                k_value = coerce_int("k", k_value, 1, UI_MAX_K)
                if not isinstance(adaptive, bool):
                    raise ValueError("adaptive must be true or false")
                if profile not in ("", None, *profiles.shipped()):
                    raise ValueError("pick a cost profile from the list")
            except ValueError as e:
                raise user_error(e) from None
            trace = held_run(key, request)
            if trace is None and (why := gone(key, request)):
                return f"<div class='specviz-lab'>{why}.</div>", "", None
            if (why := explorer_refusal(trace, opened=shelf.opened(trace))) is not None:
                return f"<div class='specviz-lab'>{html.escape(why)}</div>", "", None
            measured = [len(e.new_tokens) for e in trace.events]
            try:
                html_text, numbers, fig = labview.explorer_views(
                    trace.recording, k_value, adaptive, int(trace.settings.get("k", 0)) or None,
                    measured if trace.settings.get("proposer") in ("draft", "ngram") else None,
                    profile or None, trace.stats.prefilled_costs)
            except ValueError as e:
                raise user_error(e) from None
            return numbers, html_text, fig

        def play_tree(round_number, key, request: gr.Request = None):
            """The tree playback: one round of the kept run (no model call)."""
            try:
                round_number = coerce_int("round", round_number, 1, 1_000_000)
                trace = kept_run(key, "no run yet: run the token tree drafter first (or open a trace)",
                                 request)
                return tree_round(trace, round_number, store.current())
            except ValueError as e:
                raise user_error(e) from None

        def explorer_k(key):
            trace = shelf.get(key)
            return int(trace.settings.get("k", 4)) if trace is not None else gr.skip()

        def save(key, request: gr.Request = None):
            try:
                trace = kept_run(key, "no run to save yet: run something first", request)
            except ValueError as e:
                raise user_error(e) from None
            SAVES.mkdir(exist_ok=True)
            kept = 0  # bytes of the saves of the last SAVE_TTL seconds
            for old in SAVES.glob("*.json"):  # gradio copies the file into its cache at once
                try:
                    stat = old.stat()
                except FileNotFoundError:  # swept by a save running beside this one
                    continue
                if time.time() - stat.st_mtime > SAVE_TTL:
                    old.unlink(missing_ok=True)
                else:
                    kept += stat.st_size
            # one file a trace's content, written once: saving it again, from any page (or a
            # script opening one trace under many sessions), reuses it, and Gradio's cache, keyed
            # by content, keeps one copy of it too
            data = trace.to_json().encode("utf-8")
            if len(data) > MAX_TRACE_BYTES:  # a file that would be refused on opening: say so now
                raise gr.Error(f"this run's trace is {mib_over(len(data))} MiB, over the "
                               f"{MAX_TRACE_BYTES // 2**20} MiB a trace may be to open again (a tree "
                               "run of 64-node rounds reaches it near 450 new tokens): run fewer new "
                               "tokens or tree nodes to save one", print_exception=False)
            path = SAVES / f"specviz-trace-{hashlib.sha256(data).hexdigest()[:16]}.json"
            if not path.exists():
                if kept + len(data) > limits.upload_mb * 2**20:  # saves are downloads: as much
                    raise gr.Error("the server has saved as many traces as it keeps at once: "
                                   f"try again in {SAVE_TTL // 60} minutes")  # disk as uploads
                path.write_bytes(data)
            return str(path)

        def open_trace(path, request: gr.Request):
            n = len(outputs) + len(controls) + 1
            if not path:
                yield (gr.skip(),) * n
                return
            yield from said_on_error(opened(path, request), n, at=n - 1)

        def opened(path, request):
            tidy()  # the empty files Gradio's File left for earlier uploads, and pages gone
            try:
                if not isinstance(path, str):
                    raise ValueError("open a trace file (.json)")
                if held(session_of(request)):  # its end would replace the trace opened, and its
                    # views the page's, under the trace's controls, link and status
                    raise ValueError(OPEN_DURING_JOB)
                address = public_address(visitor(request))
                if address and (why := opens.refuse(address, None, time.monotonic())):  # each costs
                    raise ValueError(why)  # seconds
                try:
                    with open(path, "rb") as f:
                        data = f.read(MAX_TRACE_BYTES + 1)
                except OSError:  # cleaned from the upload cache, or a path that names nothing
                    raise ValueError("the uploaded file is gone (uploads are cleaned after a few "
                                     "minutes): upload the trace again") from None
                trace = loads(data)
                view = replay_view(trace, store.current())
            except ValueError as e:
                if str(e).startswith("not a valid specviz trace") and "save it again" not in str(e):
                    e = ValueError(f"{e}. Open a file saved with \"Save the last run as a trace\", "
                                   "whole and unedited")
                raise user_error(e) from None
            key = shelf.put(session_of(request), trace, nbytes=held_bytes(data),
                            address=visitor(request), uploaded=True)
            s, notices = from_trace(trace.settings, default, limits, store.known_pairs)
            kept = ("Its settings are in the Run tab's controls: **Run** runs it again"
                    + (f" (⚠ {notices_text(notices)})" if notices else "") + ".")
            yield (*show(replace(view, trace=None), None, final=True)[:-1], key, *control_values(s),
                   f"Opened: {view.status}. See the Run tab and the k explorer. {kept}")

        def free_session(request: gr.Request):
            # the page's run stays on the shelf until its state goes (hooks.Tidy: closed and unused
            # for PAGE_GRACE; State's delete callback): Gradio runs this when the heartbeat stream
            # drops, which a page still open does too (a network change, a laptop's sleep), and its
            # page never opens another, yet goes on working; dropped here at once, its run was
            # gone under it and Save said "run something first". The rounds its side plots lag go
            # (`sides`): Gradio keeps a closed page's values an hour, whatever their time to live
            drop_value(getattr(demo, "state_holder", None), session_of(request), sides._id)
            tidy()

        # Model jobs start at once (no Gradio limit): the gate is the limit, so a busy visitor or a
        # full line is answered at once, and waiting jobs show their place and can be stopped.
        model = dict(concurrency_limit=None, concurrency_id="model", preprocess=False)
        autorun = gr.State(False)
        # progress and a visitor's error shown on the status alone: by default Gradio drew a red
        # "Error" pill over every output (a dozen, over the last run's results, after a typo)
        model |= dict(show_progress_on=status)
        run_event = run_btn.click(run, controls, outputs, api_name="run", **model)
        pair.input(pair_changed, pair, chat, api_name=False, preprocess=False)
        proposer.change(None, proposer, None, js=TREE_PANEL_JS, api_name=False)  # in the browser
        link_btn.click(share_query, controls, link, api_name=False, preprocess=False).then(
            None, link, link, js=COPY_JS)
        demo.load(on_load, None, [*controls, notice, autorun, run_btn], api_name=False).failure(
            None, None, [run_btn, notice], js=LOAD_REFUSED_JS, api_name=False, queue=False)
        for tab in (run_tab, lab_tab, explorer_tab):  # no Python runs: the browser redraws the plots
            tab.select(None, None, None, js=REDRAW_JS, api_name=False, queue=False)
        auto_event = autorun.change(auto_run, [autorun, *controls], outputs, api_name=False, **model)
        rerun_event = rerun32.click(rerun_float32, [last, *controls], outputs, api_name=False, **model)
        lab_event = lab_btn.click(lab_run, [lab_source, lab_round, lab_trials, lab_variants, last],
                                  [lab_info, lab_masses, lab_mc, lab_table], api_name="lab",
                                  **(model | dict(show_progress_on=lab_info)))
        e2e_event = e2e_btn.click(e2e_run, [e2e_n, *controls], e2e_out, api_name="e2e",
                                  **(model | dict(show_progress_on=e2e_out)))
        # Gradio completes a cancelled event with no output: the page said "round 6" for good
        # A stopped run's flush makes the plots its last headline left behind (caught_up)
        for button, shown, said, cancelled, flush_step in (
                (stop_btn, [status, lab_info, e2e_out], {"status": STOPPED, "lab-info": LAB_STOPPED,
                                                         "e2e-out": LAB_STOPPED},
                 [run_event, auto_event, rerun_event, lab_event, e2e_event],
                 (caught_up, [sides], [*plot_outputs.values(), sides])),
                (lab_stop, [lab_info, e2e_out], {"lab-info": LAB_STOPPED, "e2e-out": LAB_STOPPED},
                 [lab_event, e2e_event], (flushed, None, None))):  # the lab's jobs wait in line too
            click, wait, after = stop_js(said)
            flush = button.click(None, shown, shown, js=click, api_name=False, cancels=cancelled).then(
                *flush_step, js=wait, api_name=False, concurrency_limit=None,
                concurrency_id="stop", show_progress="hidden")
            for step in (flush.then, flush.failure):  # a flush refused (the queue full): said anyway
                step(None, shown, shown, js=after, api_name=False)
        # The views of a held run, and uploads, each wait in a line of their own (one at a time):
        # a flood of uploads delays other uploads, not the k explorer or the tree playback.
        explore_inputs = [ex_k, ex_adaptive, ex_profile, last]
        views = dict(api_name=False, preprocess=False, concurrency_limit=1, concurrency_id="views")
        # always_last: a drag of k sends an input at each step, and under Gradio's default for an
        # input ("once") those sent while one was computed were dropped, the drag's last among them:
        # the explorer then showed another k than its slider (.change is always_last already)
        for trigger in (ex_k.input, ex_adaptive.change, ex_profile.change):
            trigger(explore, explore_inputs, [ex_numbers, ex_text, ex_plot], trigger_mode="always_last",
                    **views)
        last.change(explorer_k, last, ex_k, **views).then(
            explore, explore_inputs, [ex_numbers, ex_text, ex_plot], **views)
        tree_slider.input(play_tree, [tree_slider, last], [tree_view, tree_overview],
                          trigger_mode="always_last", **views)
        save_btn.click(save, last, save_file, api_name=False)
        open_file.upload(open_trace, open_file, [*outputs, *controls, replay_status], api_name="open_trace",
                         concurrency_limit=1, concurrency_id="upload", show_progress_on=replay_status)
        demo.unload(free_session)
    # Model jobs never wait in Gradio's queue (the gate is their line), so it holds only events
    # waiting for a free handler: bounded per line, well above what the gate lets through, and
    # per public address, so that no one client fills a line or every line.
    # Gradio's own bound is set above all the lines' (on ZeroGPU it defaults to one waiting event
    # in all, which refused a second visitor's page load or link)
    per_line, lines = QUEUE_PER_JOB * limits.queue_size, {fn.concurrency_id for fn in demo.fns.values()}
    demo.queue(default_concurrency_limit=1, api_open=False, max_size=per_line * len(lines))
    # Gradio's queue looks for waiting events every millisecond, and for progress to send every 10,
    # however long nobody uses the app: 7-8% of a core idle (800 wake-ups a second) on a Space's two
    # cores. At Gradio's own periods on Windows (QUEUE_POLL) an event waits at most 50 ms more to
    # start, and progress is sent 10 times a second: under 1% of a core idle
    demo._queue.sleep_when_free, demo._queue.progress_update_sleep_when_free = QUEUE_POLL
    forbid_downloads()
    cap_queue(demo._queue, per_line=per_line,
              per_address=QUEUE_PER_JOB * limits.jobs_per_address,
              pages=pages, max_chars=4 * limits.max_prompt_chars + 16 * 2**10,
              proxies=limits.trust_forwarded)
    return demo


def preload(store: ModelStore, settings: RunSettings) -> None:
    """Load the default pair in the background so the first Run starts at once."""
    try:
        store.get(settings)
    except Exception as e:  # noqa: BLE001 - the first Run shows the same error to the user
        print(f"specviz: could not preload the default pair: {e}")


def parse_args(argv=None):
    """The app's flags, its address resolved: --host, else GRADIO_SERVER_NAME, else 0.0.0.0 in a
    container (SPECVIZ_IN_CONTAINER=1) or on a Space (SPACE_ID), else 127.0.0.1; --port, else
    GRADIO_SERVER_PORT, else 7860. The environment is read after the flags, so --help prints
    whatever it holds; a mistyped value stops start-up naming it (on a Space too)."""
    p = argparse.ArgumentParser(description="specviz web app")
    p.add_argument("--target", help="target model (hub id, folder or .gguf); default: embedded pair")
    p.add_argument("--draft", help="draft model for --target")
    p.add_argument("--device", help="cuda, mps or cpu (default: best available)")
    p.add_argument("--host", help="address to listen on (default: GRADIO_SERVER_NAME, else 0.0.0.0 on a "
                                  "Space or with SPECVIZ_IN_CONTAINER=1, else 127.0.0.1)")
    p.add_argument("--port", help="port to listen on (default: GRADIO_SERVER_PORT, else 7860)")
    args = p.parse_args(argv)
    if args.draft and not args.target:  # it served the embedded pair, the draft silently unused
        raise SystemExit("specviz: error: --draft drafts for --target: give --target MODEL too, or drop "
                         "--draft to serve the embedded pair")
    try:
        in_container = env_flag("SPECVIZ_IN_CONTAINER") is True or bool(os.environ.get("SPACE_ID"))
        env_port = os.environ.get("GRADIO_SERVER_PORT", "").strip()
        args.port = (port(args.port, "--port") if args.port is not None
                     else port(env_port, "GRADIO_SERVER_PORT") if env_port else 7860)
    except ValueError as e:  # as main's own refusals of the environment
        raise SystemExit(f"specviz: error: {e}") from None
    args.host = (args.host or os.environ.get("GRADIO_SERVER_NAME", "").strip()
                 or ("0.0.0.0" if in_container else "127.0.0.1"))
    return args


def main(argv=None):
    args = parse_args(argv)
    extra = {"command-line": (args.target, args.draft)} if args.target else {}
    on_zerogpu = zerogpu.active()
    try:
        device = "cuda" if on_zerogpu else check_device(args.device) if args.device else default_device()
        limits = Limits.from_env()  # an operator's typo (SPECVIZ_MAX_NEW_TOKENS=lots): a traceback
    except ValueError as e:  # every job would fail on it: say so before serving
        raise SystemExit(f"specviz: error: {e}") from None
    limits = limits.for_device(device.split(":")[0])
    # On ZeroGPU a load runs in a GPU worker, in the visitor's own GPU time, and its refusal would
    # be an error there, after which spaces forks a fresh worker (the page's pair, no loads counted):
    # the share would throw away the pair it guards and let the retry through. No share there.
    store = ModelStore(extra, device=device, fast=zerogpu.FAST if on_zerogpu else None,
                       warm=not on_zerogpu, switch_share=None if on_zerogpu else RELOAD_SHARE,
                       keep_home=on_zerogpu, max_download=limits.max_download_gb * 1e9)
    default = RunSettings(pair="command-line") if args.target else RunSettings()
    if args.target:
        default = replace(default, chat="instruct" in args.target.lower())
    demo = build(store, limits, default)
    default = demo.specviz.default  # within the limits: the page's own, which the preload loads
    if on_zerogpu:  # ZeroGPU: models go to "cuda" in the main process, before the first job
        try:
            store.get(default)
        except Exception as e:  # noqa: BLE001 - every job would load it again inside its GPU time
            raise SystemExit(f"specviz: could not place the default pair on the GPU at start-up, as "
                             f"ZeroGPU requires: {type(e).__name__}: {e}") from e
    else:
        threading.Thread(target=preload, args=(store, default), daemon=True).start()
    demo.launch(server_name=args.host, server_port=args.port, theme=gr.themes.Soft(), **page_assets(),
                **launch_options(demo))


if __name__ == "__main__":
    main()
