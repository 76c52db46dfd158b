"""A page in use keeps what it shows: its run is never denied under it."""

import time

import pytest
from test_hostile_app import call_hidden, make_trace

from specviz.settings import Limits, RunSettings

IDLE = 2.0  # app.TRACE_TTL here: seconds a page may go unused (an hour on a server)


@pytest.fixture(scope="module")
def served(model_dirs):
    from test_app import free_port

    import app
    from specviz.service import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(app, "TRACE_TTL", IDLE)  # the hour a page may go unused, shortened
        demo = app.build(store, Limits(max_new_tokens=200),
                         RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                **app.launch_options(demo))
    demo.url = f"http://127.0.0.1:{port}/"
    yield demo
    demo.close()


def test_a_page_in_use_is_never_told_to_run_first_under_the_run_it_shows(served, tmp_path):
    """The page's trace key (the State `last`) had a time to live counted from when it was set
    (TRACE_TTL, an hour), not from its page's last use: a visitor who opened a trace (or ran
    one) and then spent an hour in the k explorer and the lab lost the run under the page that
    still showed it, and was told "no run to save yet: run something first" by Save, "Run at
    temperature 0 ... first" by the explorer and "no run yet" by the lab, all false. Here the
    hour is IDLE seconds, and the page is used every quarter of a second for twice as long."""
    from gradio_client import Client, handle_file

    path = tmp_path / "opened.json"
    path.write_text(make_trace(served, max_new_tokens=12).to_json())
    c = Client(served.url, verbose=False)
    c.predict(handle_file(str(path)), api_name="/open_trace")
    page = c.session_hash
    assert '"success":true' in call_hidden(served, "save", [None], page).replace(" ", "")
    end = time.monotonic() + 2 * IDLE
    while time.monotonic() < end:  # the visitor slides k in the explorer: the page is in use
        shown = call_hidden(served, "explore", [3, False, "", None], page)
        assert "first" not in shown, shown[-300:]
        time.sleep(0.25)
    saved = call_hidden(served, "save", [None], page)
    assert "run something first" not in saved, saved[-400:]
    # ... and a page left unused longer than that still lets its run go (guard.Tidy, next upload)
    shelf = served.specviz.shelf
    assert any(held.session == page for held in shelf._items.values())
    time.sleep(IDLE + 1.5)
    served.specviz.tidy.last = -float("inf")  # it runs once a minute: now
    Client(served.url, verbose=False).predict(handle_file(str(path)), api_name="/open_trace")
    assert not any(held.session == page for held in shelf._items.values())
