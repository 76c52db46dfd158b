"""Sequences of a visitor's actions on the app's handlers (no browser): what the page shows
afterwards belongs to one run."""

import time

import gradio as gr
import pytest
from conftest import handler
from test_hostile_app import args, page_request

from specviz.settings import Limits, RunSettings

SHOWN = ["status", "text", "verdict", "stats", "timeline", "tokens_per_pass", "cumulative",
         "acceptance", "k_prediction", "time", "tree", "tree_slider", "tree_overview", "tree_nodes",
         "tree_chain", "sides", "last"]


class Page:
    """What one page shows, as Gradio keeps it: each output's last value (a skip keeps it, an
    update changes only what it names)."""

    def __init__(self):
        self.props: dict[str, dict] = {}

    def apply(self, out):
        for name, value in zip(SHOWN, out, strict=True):
            props = dict(self.props.get(name, {}))
            if isinstance(value, dict) and value.get("__type__") == "update":
                props.update({k: v for k, v in value.items() if k != "__type__"})
            else:
                props["value"] = value
            self.props[name] = props

    def run(self, demo, session: str, **over):
        """Press Run: every output it streams lands on the page; a gr.Error is returned."""
        try:
            for out in handler(demo, "run")(page_request(session), None, *args(**over)):
                self.apply(out)
        except gr.Error as e:
            return e
        return None


@pytest.fixture(scope="module")
def demo(model_dirs):
    import app
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    return app.build(store, Limits(max_new_tokens=200),
                     RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))


def test_a_run_refused_once_its_pair_has_loaded_leaves_the_last_run_whole(demo):
    """A run that loads another pair or dtype first says "Loading tiny…", and that view blanked
    the text, verdict, counters and timeline; an error after the load (here the prompt and max
    new tokens past the tiny target's 256 positions; a switch refused by the server's loading
    budget, or Stop, the same) then kept the page as it stood (error_outputs): the last run's
    plots, tree drawing, playback slider and tree plots, with no text or counters of that run
    beside them, under a status about another run. The page keeps the last run whole."""
    page = Page()
    assert page.run(demo, "half", proposer="tree", nodes=6, branching=2, max_new_tokens=12) is None
    before = {name: props.get("value") for name, props in page.props.items()}
    assert before["status"].startswith("Done") and "tokens per target pass" in before["stats"]
    error = page.run(demo, "half", dtype="bfloat16", max_new_tokens=200,
                     prompt=" ".join(["for i in range(10): print(i * i)"] * 6))
    assert error is not None and "positions" in str(error)
    after = {name: props.get("value") for name, props in page.props.items()}
    assert after["status"].startswith("⚠ prompt")
    # the last run's plots and tree panel are still shown, and it is still the page's run
    for name in ("tokens_per_pass", "time", "tree", "tree_overview", "tree_chain", "last"):
        assert after[name] is before[name], name
    assert page.props["tree_slider"]["interactive"] is True  # its playback still plays that run
    # ... so its text, verdict, counters and timeline must be too
    for name in ("text", "verdict", "stats", "timeline"):
        assert after[name] == before[name], f"{name}: {str(after[name])[:80]!r}"


def test_a_run_stopped_while_its_pair_loads_leaves_the_last_run_whole(demo):
    """Stop pressed during "Loading tiny…" (a switch of dtype takes 12-22 s on the embedded pair):
    the page said "Stopped" over the last run's plots and tree panel with its text and counters
    blanked."""
    page = Page()
    assert page.run(demo, "stopped", proposer="tree", nodes=6, branching=2, max_new_tokens=12) is None
    before = {name: props.get("value") for name, props in page.props.items()}
    job = handler(demo, "run")(page_request("stopped"), None, *args(dtype="bfloat16", max_new_tokens=12))
    for out in job:
        page.apply(out)
        if str(out[0]).startswith("Loading"):
            break
    job.close()  # Stop: Gradio cancels the job at the view it last sent
    store, end = demo.specviz.store, time.monotonic() + 60
    while not store.is_loaded(RunSettings(pair="tiny", dtype="bfloat16")) and time.monotonic() < end:
        time.sleep(0.05)  # the load goes on to its end in a thread of its own
    after = {name: props.get("value") for name, props in page.props.items()}
    assert after["last"] is before["last"] and after["tree_chain"] is before["tree_chain"]
    for name in ("text", "verdict", "stats", "timeline"):
        assert after[name] == before[name], f"{name}: {str(after[name])[:80]!r}"


def test_a_streamed_run_sends_its_text_as_appends_and_the_page_ends_on_the_whole_run(demo, monkeypatch):
    """Through Gradio's own stream (each output postprocessed, then diffed against the last by
    Blocks.handle_streaming_diffs): the token text goes as appends, so a run's text costs about
    its final size, not a copy a view (3.4 MiB against 0.5 for 128 tokens a view a round); the
    timeline, tree overview and plots come with the plots' refreshes, and the page then shows
    what the finished run shows."""
    import asyncio
    import json

    from gradio.state_holder import SessionState

    from specviz import service

    monkeypatch.setattr(service, "VIEW_SECONDS", 0.0)  # every round a view
    outs = list(handler(demo, "run")(page_request("appends"), None,
                                     *args(proposer="tree", nodes=6, branching=2, max_new_tokens=60)))
    page = Page()
    for out in outs:
        page.apply(out)
    for name in ("text", "stats", "timeline", "tree", "tree_overview", "tokens_per_pass", "tree_chain"):
        last = outs[-1][SHOWN.index(name)]
        assert page.props[name]["value"] == (last["value"] if isinstance(last, dict) else last), name
    first = next(i for i, out in enumerate(outs) if isinstance(out[1], str))  # the first with a run
    skipped = [out[SHOWN.index("timeline")] == gr.skip() for out in outs[first:-1]]
    assert any(skipped) and not all(skipped)
    fn, state, text, edits = next(f for f in demo.fns.values() if f.name == "run"), SessionState(demo), 1, []
    sent = [asyncio.run(demo.postprocess_data(fn, list(out), state)) for out in outs]  # (takes updates'
    for data in sent:  # values out of them)
        edits.append(demo.handle_streaming_diffs(fn, list(data), "appends", "run", final=False)[text])
    demo._pop_run_diffs("appends", "run")
    assert len(outs) - first > 30 and sent[first][text] == edits[first][0][2]  # the whole text once
    later = [edit for step in edits[first + 1:] for edit in step]
    assert later and {kind for kind, _, _ in later} == {"append"}
    final = sent[-1][text]
    assert final.endswith("</div>") and len(json.dumps(edits[first:])) < 1.5 * len(final)
    assert sum(len(data[text]) for data in sent[first:]) > 10 * len(final)  # what went before


PLOTS = ["tokens_per_pass", "cumulative", "acceptance", "k_prediction", "time", "tree_nodes", "tree_chain"]


def test_a_streamed_runs_plots_beside_the_headline_come_less_often_and_end_as_the_finished_run(
        demo, monkeypatch):
    """The browser draws a plot afresh at each update of it: while a run streams, the page gets
    the phase's headline plot (tokens per pass, then the race against the baseline: tokens over
    time) at every refresh of the plots and the others, the tree run's two among them, at most
    every service.SIDE_PLOT_SECONDS (a skip between: the page keeps what it shows); the first
    refresh of each phase and the finished run's view bring them all, and the page ends on the
    finished run's plots."""
    import itertools

    from test_service import clock_of_seconds

    from specviz import service
    from specviz.store import Baselines

    over = dict(proposer="tree", nodes=6, branching=2, max_new_tokens=60)
    store = demo.specviz.store
    store.get(RunSettings(pair="tiny", dtype="float32"))  # loaded on the real clock
    store.baselines, store.chains = Baselines(), Baselines()  # both streamed too
    monkeypatch.setattr(service, "VIEW_SECONDS", 0.0)
    clock_of_seconds(monkeypatch, 0.1)
    reads = itertools.count()  # plots that cost 0.01 s: refreshed every PLOT_SECONDS
    monkeypatch.setattr(service.time, "perf_counter", lambda: 0.01 * next(reads))
    outs = list(handler(demo, "run")(page_request("sides"), None, *args(**over)))
    page = Page()
    for out in outs:
        page.apply(out)

    def sent(out, name) -> bool:
        value = out[SHOWN.index(name)]
        return not isinstance(value, dict) or "value" in value  # a figure, or an update with one

    for phase, headline in (("Speculative run", "tokens_per_pass"), ("Baseline", "time")):
        refreshes = [out for out in outs[:-1]
                     if out[0].startswith(phase) and any(sent(out, name) for name in PLOTS)]
        counts = {name: sum(sent(out, name) for out in refreshes) for name in PLOTS}
        assert all(sent(refreshes[0], name) for name in PLOTS), phase
        # (the headline 9 and 19 times here, the others once and twice)
        assert counts[headline] == len(refreshes) > 4 * counts["acceptance"] >= 4, counts
        assert {counts[name] for name in PLOTS if name != headline} == {counts["acceptance"]}, counts
    for name in PLOTS:
        last = outs[-1][SHOWN.index(name)]
        assert sent(outs[-1], name)
        assert page.props[name]["value"] is (last["value"] if isinstance(last, dict) else last), name


def paced(demo, monkeypatch) -> None:
    """The tiny pair loaded (on the real clock), then each view 0.1 s of the service's clock and
    each plot 0.01 s: the plots refreshed every PLOT_SECONDS, the side plots every SIDE_PLOT_SECONDS."""
    import itertools

    from test_service import clock_of_seconds

    from specviz import service
    from specviz.store import Baselines

    store = demo.specviz.store
    store.get(RunSettings(pair="tiny", dtype="float32"))
    store.baselines = Baselines()
    monkeypatch.setattr(service, "VIEW_SECONDS", 0.0)
    clock_of_seconds(monkeypatch, 0.1)
    reads = itertools.count()
    monkeypatch.setattr(service.time, "perf_counter", lambda: 0.01 * next(reads))


@pytest.mark.parametrize("quiet", [0, 1])
@pytest.mark.parametrize("end", ["stop", "error"])
def test_a_run_stopped_or_failing_mid_stream_ends_with_every_plot_of_its_headlines_rounds(
        demo, monkeypatch, end, quiet):
    """docs/benchmarks.md: "After a Stop, the four side plots can be up to 10 s older than the
    headline": while a run streams they come every service.SIDE_PLOT_SECONDS, the headline at every
    refresh, and a run stopped (or failing: out of memory, ZeroGPU's limit) between two left them
    so, each plot counting other rounds. The Stop's step through the queue after the cancel
    (caught_up: its answer lands after everything the stopped job had sent), or the job before
    its error, makes every plot of the rounds the page's headline shows. Also where the run ends
    `quiet` views after the headline (views with no plot: the text and counters of each round in
    between), which leave the page's plots, and the rounds behind them, as they were."""
    from specviz import service
    from specviz.figures import all_figures

    paced(demo, monkeypatch)
    alone, made, generate = [], service.all_figures, service.generate

    def figures(*a, **kw):  # notes each headline made alone (the plots beside it left as they were)
        alone.append(a[4:] == (service.HEADLINE,))
        return made(*a, **kw)

    monkeypatch.setattr(service, "all_figures", figures)

    def failing(*a, **kw):  # out of memory `quiet` rounds after the first headline made alone
        after = 0
        for event in generate(*a, **kw):
            if any(alone):
                if after == quiet:
                    raise ValueError("out of memory, as it were")
                after += 1
            yield event

    if end == "error":
        monkeypatch.setattr(service, "generate", failing)
    page, run = Page(), next(fn for fn in demo.fns.values() if fn.name == "run")
    job = handler(demo, "run")(page_request(f"sides-{end}-{quiet}"), None, *args(max_new_tokens=60))
    since = None  # the views with no plot since the first headline alone
    try:
        for out in job:
            page.apply(out)
            if str(out[0]).startswith("Speculative run"):  # what a view of the run left on the page
                shown = {name: page.props[name]["value"] for name in ("tokens_per_pass", "cumulative")}
                plotted = [not isinstance(out[SHOWN.index(name)], dict) for name in PLOTS[:5]]
                if since is None and plotted[0] and not any(plotted[1:]):  # a headline alone
                    since = 0
                elif since is not None:
                    assert not any(plotted), "plotted again before the run ended"
                    since += 1
                if end == "stop" and since == quiet:
                    break
    except gr.Error as e:
        assert end == "error" and "out of memory" in str(e)
    assert since == quiet  # the run ended `quiet` views after its first headline alone
    if end == "stop":
        job.close()  # Stop: Gradio cancels the job at the view it last sent, then the flush
        behind = page.props["sides"]["value"]
        flushed = handler(demo, "caught_up")(behind)
        page.apply(tuple(flushed.get(output, gr.skip()) for output in run.outputs))
    headline = page.props["tokens_per_pass"]["value"]
    assert headline.to_plotly_json() == shown["tokens_per_pass"].to_plotly_json()  # the same rounds
    tokens = sum(headline.data[0].y)  # the headline's: its bars, a round each
    assert shown["cumulative"].data[0].y[-1] < tokens  # the plots beside it were older ...
    assert page.props["sides"]["value"] is None
    for name in ("cumulative", "time"):  # ... and now count the headline's rounds
        assert page.props[name]["value"].data[0].y[-1] == tokens, name
    rounds = len(headline.data[0].x)
    if end == "stop":
        assert len(behind.spec.events) == rounds
        for name, figure in all_figures(behind.spec, None, k=3).items():
            assert page.props[name]["value"].to_plotly_json() == figure.to_plotly_json(), name


@pytest.mark.parametrize("end", ["stop", "error"])
def test_a_run_ending_after_a_view_of_every_plot_keeps_that_views_plots(demo, monkeypatch, end):
    """A view that sends every plot (the baseline's first, a side-plot refresh) leaves nothing
    behind its headline: a run stopped or failing after it keeps the plots it sent, not those of
    the rounds an earlier headline alone was sent with (older: they would replace newer plots)."""
    from specviz import service

    paced(demo, monkeypatch)
    made, generate, kinds = service.all_figures, service.generate, []

    def figures(*a, **kw):  # notes each set of plots made: a headline alone, or every plot
        kinds.append("alone" if len(a) > 4 and a[4] is not None else "all")
        return made(*a, **kw)

    def failing(*a, **kw):  # out of memory in the round after every plot came after a headline alone
        for event in generate(*a, **kw):
            if "alone" in kinds and kinds[-1] == "all":
                raise ValueError("out of memory, as it were")
            yield event

    monkeypatch.setattr(service, "all_figures", figures)
    if end == "error":
        monkeypatch.setattr(service, "generate", failing)
    page, run = Page(), next(fn for fn in demo.fns.values() if fn.name == "run")
    job = handler(demo, "run")(page_request(f"full-{end}"), None, *args(max_new_tokens=60))
    seen, full = False, None
    try:
        for out in job:
            page.apply(out)
            plotted = [not isinstance(out[SHOWN.index(name)], dict) for name in PLOTS[:5]]
            seen = seen or (plotted[0] and not any(plotted[1:])) or (plotted[4] and not any(plotted[:4]))
            # every plot, in a view while the run streams (the finished view holds its key)
            if seen and all(plotted) and isinstance(out[-1], dict) and isinstance(out[0], str):
                full = {name: out[SHOWN.index(name)] for name in PLOTS[:5]}
                if end == "stop":
                    break
    except gr.Error as e:
        assert end == "error" and "out of memory" in str(e)
    else:
        assert end == "stop", "the run did not fail"
    assert full is not None
    if end == "stop":
        job.close()
        flushed = handler(demo, "caught_up")(page.props["sides"]["value"])
        page.apply(tuple(flushed.get(output, gr.skip()) for output in run.outputs))
    for name, figure in full.items():
        assert page.props[name]["value"] is figure, name


def test_a_run_failing_mid_stream_says_its_own_error_when_its_plots_cannot_be_made(demo, monkeypatch):
    """A job that fails mid-run makes every plot of its headline's rounds before its error (the
    page's caught-up plots). Where making them fails too (out of memory again, a figure's bug), the
    visitor is still told the job's own error, on the status and in the toast: the plots' failure
    replaced it (raised inside the handler of the first), so a run out of memory, or past ZeroGPU's
    time, said only Gradio's bare "Error", and the status what the job said last."""
    from specviz import service

    paced(demo, monkeypatch)
    generate, alone = service.generate, []

    def failing(*a, **kw):  # out of memory in the round after a headline made alone
        for event in generate(*a, **kw):
            if alone:
                raise ValueError("out of memory, as it were")
            yield event

    def figures(self):
        raise RuntimeError("the plots failed too")

    made = service.all_figures

    def noted(*a, **kw):  # notes a headline made alone (the plots beside it left as they were)
        if a[4:] == (service.HEADLINE,):
            alone.append(True)
        return made(*a, **kw)

    monkeypatch.setattr(service, "all_figures", noted)
    monkeypatch.setattr(service, "generate", failing)
    monkeypatch.setattr(service.Sides, "figures", figures)
    page = Page()
    error = page.run(demo, "sides-fail", max_new_tokens=60)
    assert error is not None and "out of memory, as it were" in str(error), error
    assert "out of memory, as it were" in page.props["status"]["value"]


def test_the_rounds_a_cancelled_run_left_in_the_page_go_after_a_minute(demo):
    """The `sides` state holds the rounds of the run the page's headline shows (2-24 KB a tree
    round here) outside the shelf's budget: the Stop's step clears it, but a run cancelled without
    that step (an API client's /cancel, a closed page) left it for as long as Gradio kept the
    page. Gradio deletes it SIDES_TTL after its last update (every view of a run updates it)."""
    import datetime

    from gradio.state_holder import StateHolder

    import app
    from specviz.metrics import RunStats
    from specviz.service import Sides

    run = next(fn for fn in demo.fns.values() if fn.name == "run")
    sides = run.outputs[SHOWN.index("sides")]
    before = getattr(demo, "state_holder", None)
    holder = StateHolder()
    try:
        holder.set_blocks(demo)
        page = holder["cancelled"]
        # kept while the Stop's step may read it (it waits up to 10 s), gone within a minute
        for age, kept in ((app.SIDES_TTL - 5, True), (15, True), (app.SIDES_TTL + 1, False), (61, False)):
            page[sides._id] = Sides(RunStats(()), None, 3)
            ttl, _ = page._state_ttl[sides._id]
            page._state_ttl[sides._id] = (ttl, datetime.datetime.now() - datetime.timedelta(seconds=age))
            holder.delete_all_expired_state()  # as Gradio's server does every second
            assert (sides._id in page.state_data) is kept, age
    finally:
        demo.state_holder = before
    assert 10 < app.SIDES_TTL  # the Stop's step waits up to 10 s for the stopped job, then reads it


def test_the_rounds_a_closed_pages_run_left_go_with_its_unload(demo):
    """Gradio 6.31 keeps every State value of a page it marked closed (its heartbeat ended: the tab
    closed, its run cancelled) an hour after it was set, whatever the State's time_to_live: the
    rounds of `sides` (2-24 KB a tree round) stayed until Tidy let the page go (PAGE_GRACE, 10
    minutes at least, and only when a job comes) or that hour. The page's unload drops them; its
    run (`last`) stays on the shelf until the page goes (a page whose connection dropped still works)."""
    import datetime

    from gradio.state_holder import StateHolder

    import app
    from specviz.metrics import RunStats
    from specviz.service import Sides

    run = next(fn for fn in demo.fns.values() if fn.name == "run")
    sides, last = (run.outputs[SHOWN.index(name)] for name in ("sides", "last"))
    before = getattr(demo, "state_holder", None)
    holder = StateHolder()
    try:
        holder.set_blocks(demo)
        demo.state_holder = holder
        page = holder["closed"]
        page[sides._id], page[last._id] = Sides(RunStats(()), None, 3), "a key"
        page.is_closed = True  # as Gradio marks it when its heartbeat stream ends
        ttl, _ = page._state_ttl[sides._id]
        set_at = datetime.datetime.now() - datetime.timedelta(seconds=app.SIDES_TTL + 1)
        page._state_ttl[sides._id] = (ttl, set_at)
        holder.delete_all_expired_state()
        assert sides._id in page.state_data  # Gradio's hour, not the State's minute
        handler(demo, "free_session")(page_request("closed"))
        assert sides._id not in page.state_data and page.state_data[last._id] == "a key"
        handler(demo, "free_session")(page_request("closed"))  # a second unload: nothing to drop
        handler(demo, "free_session")(page_request("never-seen"))
    finally:
        demo.state_holder = before


def test_a_stops_step_makes_the_plots_of_a_runs_rounds_once(demo, monkeypatch):
    """The Stop's step (caught_up) runs at once, beside every other (concurrency_limit=None), and
    reads the page's `sides` as it starts; anyone can send it by its index (test_hostile_app's
    call_hidden). A dozen sent together while a run of one's own streamed each made every plot
    of the same rounds (0.3 s a time for a 93-round tree run here): the no-op it was became a
    dozen plot renders per request burst. The rounds' plots are made once; a later step only
    clears `sides`."""
    from concurrent.futures import ThreadPoolExecutor

    from specviz import service
    from specviz.metrics import RunStats

    page = Page()
    assert page.run(demo, "once", max_new_tokens=12) is None
    trace = demo.specviz.shelf.get(page.props["last"]["value"])
    made, real = [], service.Sides.figures

    def counted(self):
        made.append(self)
        return real(self)

    monkeypatch.setattr(service.Sides, "figures", counted)
    run = next(fn for fn in demo.fns.values() if fn.name == "run")
    plots = run.outputs[SHOWN.index("tokens_per_pass")]
    sides = run.outputs[SHOWN.index("sides")]
    behind = service.Sides(RunStats(trace.stats.events), None, 3)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: handler(demo, "caught_up")(behind), range(12)))
    assert len(made) == 1
    assert sum(plots in a for a in answers) == 1 and all(a[sides] is None for a in answers)
    other = service.Sides(RunStats(trace.stats.events), None, 3)  # the next view's rounds: made
    assert plots in handler(demo, "caught_up")(other) and len(made) == 2
    demo.specviz.shelf.drop(page.props["last"]["value"])


def test_a_run_pressed_just_after_stop_keeps_its_own_plots(demo, monkeypatch):
    """The Stop's step reads the page's `sides` as it starts and makes every plot of those rounds
    (0.3 s for a 93-round tree run here). Run pressed within that time started a new run, whose
    first view sends every plot and sets `sides` anew: the step's answer, the stopped run's plots,
    then landed over the new run's, for up to a side-plot period (10 s). Where the page's `sides`
    has moved on while they were made, the step answers nothing and leaves `sides` as the new run
    set it; where it has not, every plot and `sides` cleared."""
    from gradio.state_holder import StateHolder

    from specviz import service
    from specviz.metrics import RunStats

    run = next(fn for fn in demo.fns.values() if fn.name == "run")
    sides, plots = run.outputs[SHOWN.index("sides")], run.outputs[SHOWN.index("tokens_per_pass")]
    before, holder = getattr(demo, "state_holder", None), StateHolder()
    real = service.Sides.figures
    try:
        holder.set_blocks(demo)
        demo.state_holder = holder
        for moved in (True, False):
            page, stopped = holder[f"rerun-{moved}"], service.Sides(RunStats(()), None, 3)
            page[sides._id] = stopped
            newer = service.Sides(RunStats(()), None, 3)  # the new run's first rounds

            def made(self, page=page, moved=moved, newer=newer):  # the new run's first view lands
                if moved:
                    page[sides._id] = newer
                return real(self)

            monkeypatch.setattr(service.Sides, "figures", made)
            answer = handler(demo, "caught_up")(stopped, page_request(f"rerun-{moved}"))
            if moved:
                assert plots not in answer and answer[sides] == gr.skip()
                assert page.state_data[sides._id] is newer
            else:
                assert plots in answer and answer[sides] is None
    finally:
        demo.state_holder = before


def test_the_stops_step_keeps_no_rounds_alive(demo):
    """The Stop's step remembers which rounds it has plotted (each once), and a remembered round
    is 23.5 KB of a tree run, outside the shelf's budget: a page's rounds, once the page's `sides`
    has let them go, are freed, whatever the step remembers."""
    import gc
    import weakref

    from specviz.metrics import RunStats
    from specviz.service import Sides

    behind = Sides(RunStats(()), None, 3)
    gone = weakref.ref(behind)
    handler(demo, "caught_up")(behind)
    del behind
    gc.collect()
    assert gone() is None


def test_a_drag_of_the_k_explorers_slider_or_the_playbacks_ends_on_the_value_it_left(demo):
    """A slider's drag sends an input at each step, and Gradio drops those sent while the last one
    is computed under its default for an input ("once"), the drag's last among them: the k
    explorer showed another k than its slider. Both sliders' inputs run the last one sent."""
    dragged = {fn.name: fn.trigger_mode for fn in demo.fns.values() if fn.name in ("explore", "play_tree")
               and any(event == "input" for _, event in fn.targets)}
    assert dragged == {"explore": "always_last", "play_tree": "always_last"}


def test_the_lab_waits_for_a_load_a_stopped_job_left_under_way(demo, monkeypatch):
    """Stop during a load lets the job go at once while the load goes on to its end, with no pair
    loaded meanwhile: the lab on a round of the page's run, next in line, read that and said "no
    pair is loaded: run something first" under the run it had just made. It waits for the load
    (its status says so) and reads the pair loaded then."""
    store = demo.specviz.store
    page = Page()
    assert page.run(demo, "lab-page", max_new_tokens=8) is None
    key = page.props["last"]["value"]
    assert page.run(demo, "lab-other", dtype="bfloat16", max_new_tokens=8) is None  # another pair
    load = store._load
    monkeypatch.setattr(store, "_load", lambda s: (time.sleep(1.5), load(s))[1])
    job = handler(demo, "run")(page_request("lab-page"), None, *args(max_new_tokens=8))
    assert next(str(out[0]) for out in job if not str(out[0]).startswith("waiting")).startswith("Loading")
    job.close()  # Stop: the page's float32 pair goes on loading
    outs = list(handler(demo, "lab_run")("round", 1, 2000, ["exact"], key, page_request("lab-page")))
    assert "Waiting for a pair to finish loading" in outs[0][0]
    assert "round 1, draft position 1" in outs[-1][0]


def test_the_labs_drafted_token_holding_part_of_a_character_is_labelled_by_its_byte(demo, monkeypatch):
    """A round's drafted token that holds part of a character read "Drafted token '�'", as every
    such token did: it reads as its byte, as its bar does."""
    import torch

    from specviz import labview
    from specviz.detok import _BYTE_OF

    page = Page()
    assert page.run(demo, "lab-label", max_new_tokens=8) is None
    pair = demo.specviz.store.current()
    char_of = {b: c for c, b in _BYTE_OF.items()}
    drafted = pair.tokenizer.convert_tokens_to_ids(char_of[0xF0])  # the byte f0 alone: a rocket's first
    assert pair.tokenizer.decode([drafted]) == "\ufffd"
    p = torch.full((pair.vocab_size,), 1 / pair.vocab_size, dtype=torch.float64)

    def steps(*args, **kwargs):  # the round's p and q, without reading the models
        yield from ()
        return p, p, None, drafted, "round 1, draft position 1"

    monkeypatch.setattr(labview, "from_round_steps", steps)
    outs = list(handler(demo, "lab_run")("round", 1, 2000, ["exact"], page.props["last"]["value"],
                                         page_request("lab-label")))
    assert "Drafted token &#x27;\\xf0&#x27;: p(x)=" in outs[-1][0]


def test_a_trace_opened_while_the_pages_run_streams_is_refused_until_it_ends(demo):
    """Opened mid-run, a trace set the controls, share link and status to itself, the run's views
    then went on under them, and the run's end replaced the trace on the shelf: the page showed
    one run under another's settings, and its link and Re-run in float32 named the trace's."""
    page = Page()
    assert page.run(demo, "opener", prompt="class Stack:", k=2, max_new_tokens=6) is None
    saved = handler(demo, "save")(page.props["last"]["value"], page_request("opener"))
    job = handler(demo, "run")(page_request("opener"), None, *args(prompt="def fibonacci(n):", k=3,
                                                                      max_new_tokens=12))
    page.apply(next(job))  # the run holds its place in the gate
    with pytest.raises(gr.Error, match="this page has a job under way .*: press Stop or wait for it to end"):
        list(handler(demo, "open_trace")(saved, page_request("opener")))
    opened_elsewhere = list(handler(demo, "open_trace")(saved, page_request("another page")))
    assert opened_elsewhere[-1][-1].startswith("Opened: ")  # another page's job does not stop it
    for out in job:
        page.apply(out)
    assert page.props["status"]["value"].startswith("Done")
    assert list(handler(demo, "open_trace")(saved, page_request("opener")))[-1][-1].startswith("Opened: ")
