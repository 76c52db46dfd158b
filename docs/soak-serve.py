"""The soak's server (docs/load-test.md, "Two thousand jobs in a row"): the app on the tests' tiny
pair, as tests/test_hostile_app.py's demo fixture builds it, printing every 15 s how many pages
Gradio holds and how many runs (and MiB) the shelf holds. From the repository root:

    mkdir -p /tmp/soak && GRACE=60 JOBSECS=30 GRADIO_TEMP_DIR=/tmp/soak/gtmp \\
        python docs/soak-serve.py & echo $! > /tmp/soak/server.pid
    python docs/soak.py 720   # seconds of load; samples in /tmp/soak/samples.csv

GRACE shortens app.PAGE_GRACE (a closed page's grace) for a measurement, with JOBSECS the job
limit (the grace is at least twice it); IDLE shortens app.TRACE_TTL (how long a page that never
closes keeps its state and its run); MODELS is where the tiny pair is saved (made if missing);
PORT the port (7873)."""

import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.pop("SPACE_ID", None)


def main() -> None:
    import torch
    gradio_temp = os.environ.pop("GRADIO_TEMP_DIR", None)  # conftest would make its own cache in it
    from conftest import EOS, make_model, make_tokenizer, perturbed
    if gradio_temp:  # the folder the soak samples is Gradio's own, as before conftest made one
        os.environ["GRADIO_TEMP_DIR"] = gradio_temp

    import app
    from specviz.settings import Limits, RunSettings
    from specviz.store import ModelStore

    torch.set_num_threads(1)
    root = pathlib.Path(os.environ.get("MODELS", "/tmp/soak/models"))
    if not (root / "draft" / "config.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        tok = make_tokenizer(root)
        target = make_model("qwen2", len(tok), 0, tok.convert_tokens_to_ids(EOS))
        for name, model in {"target": target, "draft": perturbed(target, 1, 0.05)}.items():
            model.save_pretrained(root / name)
            tok.save_pretrained(root / name)
    app.PAGE_GRACE = int(os.environ.get("GRACE", app.PAGE_GRACE))
    app.TRACE_TTL = int(os.environ.get("IDLE", app.TRACE_TTL))
    store = ModelStore({"tiny": (str(root / "target"), str(root / "draft"))}, device="cpu")
    limits = Limits(max_new_tokens=200, max_job_seconds=int(os.environ.get("JOBSECS", 300)))
    demo = app.build(store, limits, RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))
    port = int(os.environ.get("PORT", 7873))
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                **app.page_assets(), **app.launch_options(demo))
    print("READY", port, flush=True)
    while True:
        time.sleep(15)
        shelf = demo.specviz.shelf
        print("PAGES", round(time.time()), len(demo.state_holder.session_data), "SHELF", len(shelf),
              round(shelf.nbytes / 2**20, 2), flush=True)


if __name__ == "__main__":
    main()
