"""The app's service layer on tiny models: streamed views, the trace, end-to-end sampling."""

import pytest

from specviz.service import ModelStore, run_views, sample_continuations
from specviz.settings import Limits, RunSettings


@pytest.fixture(scope="module")
def store(model_dirs):
    return ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")


def test_views_stream_then_end_with_a_trace_and_recording(store):
    s = RunSettings(pair="tiny", chat=False, max_new_tokens=16, prompt="def f", dtype="float32")
    views = list(run_views(store, s, Limits()))
    assert len(views) > 3 and all(v.trace is None for v in views[:-1])
    last = views[-1]
    assert last.comparison.identical and last.trace.recording is not None
    assert last.trace.recording.output == last.spec.tokens and last.trace.settings["k"] == 4


def test_end_to_end_sampling_check(store):
    s = RunSettings(pair="tiny", chat=False, prompt="The dog", temperature=1.0, top_k=3, k=2,
                    dtype="float32")
    store.get(s)
    result = sample_continuations(store.current(), s, 60)
    assert result["samples"] == 60 and sum(result["spec"].values()) == sum(result["base"].values()) == 60
    assert 0 <= result["tv"] <= 1 and result["outcomes"] <= 9  # top-3 twice: at most 9 outcomes
    with pytest.raises(ValueError, match="temperature above 0"):
        sample_continuations(store.current(), RunSettings(pair="tiny", temperature=0.0), 20)
