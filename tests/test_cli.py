"""The CLI's run summary for token trees, checked against hand computations and the JSON."""

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specviz.cli import build_parser, main, run_line
from specviz.engine import RoundEvent
from specviz.metrics import RunStats
from specviz.tree import TreeNode


def models(model_dirs):
    return ["--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
            "--dtype", "float32", "--device", "cpu"]


def event(number: int, accepted: int, tree: tuple[TreeNode, ...] = (), k: int = 2) -> RoundEvent:
    return RoundEvent(round=number, k=k, draft_tokens=list(range(k)), accepted=accepted, token=0,
                      kind="recovered", new_tokens=list(range(accepted + 1)), target_probs=[1.0] * k,
                      draft_probs=[1.0] * k, target_passes=number, draft_passes=number, draft_seconds=0.0,
                      target_seconds=0.0, round_seconds=0.0, elapsed=1.0, position=0, source="tree",
                      target_cache_length=0, stop=None, tree=tree)


def test_run_line_of_a_constructed_tree_run_and_a_chain_run():
    n = TreeNode(-1, 5, 1, 0.5, 0.5)
    tree_a = (n, replace(n, token=6), replace(n, parent=0, depth=2))  # 3 nodes
    tree_b = tree_a + (replace(n, token=7), replace(n, parent=1, depth=2))  # 5 nodes
    stats = RunStats.of([event(1, 2, tree_a), event(2, 0, tree_b)])
    # 8 nodes over 2 rounds; 2 + 0 accepted: 2 / 8 = 0.250 accepted per node; no chain prediction
    assert run_line(stats) == "8 tree nodes verified (4.0 a tree round), 2 accepted: 0.250 accepted per node"
    line = (n, replace(n, parent=0, depth=2))  # a 2-node branch: 2,499 of 2,500 nodes kept is not 1.000
    nearly = RunStats.of([event(i, 2 if i > 1 else 1, line) for i in range(1, 1251)])
    assert run_line(nearly).endswith("2499 accepted: 0.9996 accepted per node")
    chain = RunStats.of([event(1, 2), event(2, 0)])  # α = 2 / 3; i.i.d. at k=2: 1 + α + α²
    assert run_line(chain) == ("per-token acceptance α 66.7% (i.i.d. prediction 2.11/pass), "
                               "accepted/drafted 50.0%")
    # an n-gram run that found no match drafts nothing: α is not 0%, there is none (the page: "—")
    nothing = RunStats.of([event(1, 0, k=0), event(2, 0, k=0)])
    assert run_line(nothing) == "nothing drafted: no acceptance to report"


def test_cli_run_of_the_target_alone_prints_no_empty_acceptance(model_dirs, capsys):
    """It printed "acceptance by position: " and nothing after it."""
    assert main(["run", *models(model_dirs), "--proposer", "none", "--max-new-tokens", "4", "def f"]) == 0
    out = capsys.readouterr().out
    assert "4 tokens in 4 target passes" in out and "acceptance by position" not in out
    assert main(["run", *models(model_dirs), "--k", "2", "--max-new-tokens", "4", "def f"]) == 0
    assert "\nacceptance by position: " in capsys.readouterr().out


def test_cli_run_on_a_terminal_under_no_color_marks_fates_without_colour(model_dirs, capsys, monkeypatch):
    """NO_COLOR (no-color.org) was not honoured: a terminal got the colours whatever it set."""
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    argv = ["run", *models(model_dirs), "--k", "2", "--max-new-tokens", "8", "def f"]
    assert main(argv) == 0
    coloured = capsys.readouterr().out.splitlines()[0]
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(argv) == 0
    marked = capsys.readouterr().out.splitlines()[0]
    assert "\x1b[32m" in coloured and re.search(r"\x1b\[3\d", marked) is None
    assert re.sub(r"\x1b\[[\d;]*m", "", marked) == re.sub(r"\x1b\[[\d;]*m", "", coloured)  # same text


def test_cli_run_tree_json_counts_nodes_and_matches_the_target_alone(model_dirs, capsys):
    rc = main(["run", *models(model_dirs), "--proposer", "tree", "--k", "3", "--nodes", "6",
               "--branching", "2", "--max-new-tokens", "12", "--json", "--compare-baseline", "def f"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rounds, summary = lines[:-1], lines[-1]
    assert all(len(r["tree"]) <= 6 for r in rounds) and len(rounds[0]["tree"]) == 6
    nodes = sum(len(r["tree"]) for r in rounds)
    assert summary["nodes_verified"] == nodes and summary["nodes"] == 6 and summary["branching"] == 2
    assert summary["accepted_per_node"] == pytest.approx(sum(r["accepted"] for r in rounds) / nodes)
    assert summary["nodes_per_round"] == pytest.approx(nodes / len(rounds))
    assert summary["predicted_tokens_per_pass"] is None
    assert summary["identical_to_baseline"] is True and summary["new_tokens"] == 12
    # what was asked, beside what the rounds did ("k": the deepest a round drafted, at most 3)
    assert summary["settings"] == {"k": 3, "max_new_tokens": 12, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                   "seed": 0, "chat": False, "ngram_size": 3} and summary["k"] <= 3


def test_cli_run_tree_text_prints_what_the_json_says(model_dirs, capsys):
    argv = ["run", *models(model_dirs), "--proposer", "tree", "--k", "3", "--nodes", "6",
            "--max-new-tokens", "12", "def f"]
    assert main(argv + ["--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summary, trees = lines[-1], sum(bool(x.get("tree")) for x in lines if x["type"] == "round")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "i.i.d. prediction" not in out and "None" not in out
    m = re.search(r"(\d+) tree nodes verified \(([\d.]+) a tree round(, ([\d.]+) a target pass)?\), (\d+) "
                  r"accepted: ([\d.]+) accepted per node", out)
    assert m, out
    rounds = summary["target_passes"]
    assert int(m[1]) == summary["nodes_verified"] and float(m[2]) == round(int(m[1]) / trees, 1)
    assert (m[4] is None) == (trees == rounds)  # per pass too, where some round verified no tree
    assert m[4] is None or float(m[4]) == round(summary["nodes_per_round"], 1) == round(int(m[1]) / rounds, 1)
    assert int(m[5]) == round(summary["accepted_per_node"] * int(m[1]))
    assert float(m[6]) == round(int(m[5]) / int(m[1]), 3)
    # sized from the measured cost (no --nodes): a summary, still no chain prediction
    assert main(argv[:7] + argv[9:]) == 0
    out = capsys.readouterr().out
    assert "tree nodes verified" in out and "i.i.d. prediction" not in out


@pytest.mark.parametrize("argv", [
    ["run", "--k", "0", "x"], ["run", "--k", "40", "x"], ["run", "--temperature", "-1", "x"],
    ["run", "--top-p", "2", "x"], ["run", "--proposer", "magic", "x"], ["run"], ["frobnicate"],
    ["run", "--proposer", "tree", "--nodes", "0", "x"], ["run", "--proposer", "tree", "--nodes", "65", "x"],
    ["run", "--proposer", "tree", "--branching", "9", "x"], ["run", "--nodes", "8", "x"],
    ["run", "--proposer", "ngram", "--branching", "2", "x"],
    ["bench", "--methods", "specviz:tree-4-n0"], ["bench", "--methods", "specviz:tree-0"],
    ["bench", "--methods", "specviz:nonsense-4"], ["bench", "--tree-nodes", "65"],
    ["costs", "--repeats", "0"],
])
def test_bad_arguments_fail_before_loading_with_one_line(argv, capsys, monkeypatch):
    from specviz import loading

    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("loaded the models"))
    fails_with_one_line(argv, capsys)


@pytest.mark.parametrize("argv", [["run", "--device", "foo", "x"], ["run", "--device", "cuda", "x"],
                                  ["costs", "--device", "tpu"]])
def test_a_device_this_machine_lacks_fails_with_one_line(argv, capsys):
    fails_with_one_line(argv, capsys)


def fails_with_one_line(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("specviz: error:"), err


@pytest.mark.parametrize("prompts", ["[]", "{}", '[{"class": "c"}]', '["def f"]'])
def test_a_bench_prompt_file_without_prompts_fails_before_loading_with_one_line(prompts, tmp_path, capsys,
                                                                               monkeypatch):
    from specviz import cli

    monkeypatch.setattr(cli, "load_from_args", lambda args: pytest.fail("loaded the models"))
    path = tmp_path / "p.json"
    path.write_text(prompts)
    assert main(["bench", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "give a JSON list of one or more" in err, err


def test_cli_run_times_a_warm_run_as_its_baseline_is(model_dirs, monkeypatch, capsys):
    """The speculative run went first and cold (a tiny model's round 1 took 2-3x a later one's), its
    baseline second and warm: a run of the target alone against itself printed 0.83-0.96x."""
    from specviz import engine, store

    calls = []
    monkeypatch.setattr(store, "warm_up", lambda pair, k: calls.append(("warm", k)))
    real = engine.generate
    monkeypatch.setattr(engine, "generate",
                        lambda *a, **kw: (calls.append(("run", kw["proposer"])), real(*a, **kw))[1])
    assert main(["run", *models(model_dirs), "--k", "3", "--max-new-tokens", "4", "--json", "def f"]) == 0
    assert calls[0] == ("warm", 3) and calls[1] == ("run", "draft")


def test_prepare_keeps_the_drafts_int4_codes_and_a_cpu_load_reads_them(model_dirs, tmp_path, monkeypatch,
                                                                         capsys):
    """`prepare` (the Docker build step) quantizes the embedded draft once; load_pair() then builds
    its int4 layers from the codes file without the clipping search."""
    import shutil

    from specviz import embedded, loading, quant

    draft = tmp_path / "draft"
    shutil.copytree(model_dirs["draft"], draft)
    folders = {embedded.TARGET: model_dirs["target"], embedded.DRAFT: draft}  # tiny stand-ins
    monkeypatch.setattr(embedded, "prepare", folders.__getitem__)
    monkeypatch.setattr(embedded, "prepare_all", lambda: tuple(folders.values()))
    assert main(["prepare"]) == 0
    codes = quant.codes_file(draft)
    assert f"cached: {codes}" in capsys.readouterr().out and codes.is_file()

    def no_search(w):
        raise AssertionError("the codes file holds these groups")

    monkeypatch.setattr(quant, "int4_groups", no_search)
    pair = loading.load_pair(device="cpu", dtype="float32")
    assert "int4 weights" in pair.draft_name
    assert any(isinstance(m, quant.Int4Linear) for m in pair.draft.modules())


def test_a_sampled_runs_baseline_is_timed_but_not_compared_token_by_token(model_dirs, capsys):
    """Sampled runs with one seed draw from the generator differently, so their texts differ by
    design; calling that "DIFFERENT ... unexplained: please report" was false."""
    argv = ["run", *models(model_dirs), "--temperature", "1", "--max-new-tokens", "12",
            "--compare-baseline", "def f"]
    assert main(argv + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["speedup"] > 0 and summary["identical_to_baseline"] is None  # the keys stay
    assert summary["verdict"] == "sampled: not compared (the runs draw differently)"
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "outputs not compared: a sampled run follows the target's distribution" in out
    assert "DIFFERENT" not in out and "please report" not in out


class Loaded(Exception):
    """Stands in for a model load: the arguments got past every check before it."""


def loaded(*args, **kwargs):
    raise Loaded


@pytest.mark.parametrize("argv, message", [
    (["run", "--pair", "embedded", "--target", "T", "x"], "--pair replaces --target/--draft"),
    (["run", "--target", "T", "x"], "this drafter needs a draft model: add --draft MODEL"),
    (["run", "--target", "T", "--proposer", "tree", "x"], "needs a draft model"),
    (["bench", "--target", "T", "--methods", "specviz:draft-4,specviz:tree-4"], "each needs a draft model"),
    # a draft method beside a method of the target alone: it ran that one alone without a word, or
    # (the plain head's draft-4) failed after the load in the Python API's words
    (["bench", "--target", "T", "--methods", "specviz:none,specviz:draft-4"],
     "--methods specviz:draft-4: each needs a draft model: add --draft MODEL"),
    (["bench", "--target", "T", "--methods", "specviz:none-plainhead,specviz:draft-4-plainhead"],
     "--methods specviz:draft-4-plainhead: each needs a draft model"),
    (["bench", "--target", "T", "--methods", "hf,specviz:tree"], "--methods specviz:tree: each needs"),
    (["bench", "--json", "/nonexistent-folder/b.json"], "--json /nonexistent-folder/b.json: cannot write"),
    (["bench", "--html", "/tmp"], "--html /tmp is a folder: give a file path (e.g. /tmp/out.html)"),
    (["bench", "--ks", "4,,5"], "--ks '4,,5': give whole numbers separated by commas, e.g. 2,4,8"),
    (["bench", "--tree-nodes", "x"], "--tree-nodes 'x': give whole numbers"),
    (["bench", "--prompts", "/nonexistent/p.json"], "--prompts /nonexistent/p.json: cannot read it (No such"),
    (["bench", "--markdown", "/nonexistent-folder/b.md"],
     "--markdown /nonexistent-folder/b.md: cannot write"),
    (["bench", "--ks", "0"], "--ks must be in 1..32"),
    # an unset shell variable: every method ran, or the default ks
    (["bench", "--methods", ""], "--methods is empty: give a comma list, or leave the flag out"),
    (["bench", "--ks", " , "], "--ks is empty: give a comma list, or leave the flag out for its default"),
    # one message named --ks, --max-new-tokens and --repeats, whichever was wrong, and no value
    (["bench", "--ks", "4,40"], "--ks must be in 1..32, got 40: pick ks in that range"),
    (["bench", "--repeats", "0"], "--repeats must be >= 1, got 0: give a positive whole number"),
    (["bench", "--ks", "40,4"], "--ks must be in 1..32, got 40: pick ks in that range"),
    (["bench", "--ks", "1,32", "--repeats", "0"], "--repeats must be >= 1, got 0"),  # 1 and 32 are in range
    (["bench", "--max-new-tokens", "-3"], "--max-new-tokens must be >= 1, got -3: give a positive"),
    # "a cost profile must be JSON": no flag, no file, no fix
    (["bench", "--profile", "/dev/null"], "--profile '/dev/null': a cost profile must be JSON: give a "
                                          "profile file that `python -m specviz gpucheck` wrote, or one of"),
    (["bench", "--methods", "specviz:ngram-4"], "the n-gram ones are specviz:ngram-8 and hf:lookup-8"),
    (["costs", "--pair", "embedded", "--draft", "D"], "--pair replaces"),
    # ignored without a word, the bench's meta still saying it ran them
    (["bench", "--methods", "specviz:draft-4", "--tree-nodes", "8"], "--methods names no tree of those"),
    (["bench", "--methods", "specviz:tree-4", "--tree-nodes", "8"], "or specviz:tree-<k>-n8, or drop"),
    (["bench", "--target", "T", "--tree-nodes", "8"], "--tree-nodes 8: no method runs them (they need"),
    (["run", "--proposer", "ngram", "--ngram", "0", "x"], "ngram_size must be an integer in 1..16"),
    (["run", "--k", "0", "x"], "k must be an integer in 1.."),
    (["run", "--top-p", "0", "x"], "top_p must be in (0, 1]"),
    (["run", ""], "the prompt is empty: type some text to continue"),  # said after a minute's load
    (["gpucheck", "--device", "cpu", "--out", "/proc/version/x"], "--out /proc/version/x: cannot make that"),
    # a folder root may "write" by its mode that takes no file (it ran its minutes, then failed to save)
    (["gpucheck", "--device", "cpu", "--out", "/proc/x"], "--out /proc/x: cannot make that folder (/proc "),
])
def test_arguments_that_cannot_work_fail_before_loading_and_name_the_fix(argv, message, monkeypatch, capsys):
    """Each of these ran first (a model load, a whole bench or a gpucheck section) and then failed
    with a traceback or the Python API's words, or (--pair) silently ran another model."""
    from specviz import gpucheck, loading, presets

    monkeypatch.setattr(loading, "load_pair", loaded)
    monkeypatch.setattr(presets, "load", loaded)
    monkeypatch.setattr(gpucheck, "run", loaded)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_bench_quick_keeps_the_ks_it_is_given_and_a_target_alone_bench_needs_no_draft(monkeypatch, tmp_path):
    """--quick replaced --ks 2 with 4, then said a draft-2 method needs its k in --ks."""
    from specviz import cli

    monkeypatch.setattr(cli, "load_from_args", loaded)
    for argv in (["--quick", "--ks", "2", "--methods", "specviz:draft-2"],
                 ["--target", "T", "--methods", "hf:target,specviz:none,specviz:ngram"],
                 ["--json", str(tmp_path / "b.json")]):
        with pytest.raises(Loaded):
            main(["bench", *argv])


def test_bench_quick_runs_one_prompt_a_class_and_at_most_32_tokens(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from specviz import bench, cli

    ran = []
    monkeypatch.setattr(cli, "load_from_args", lambda args: SimpleNamespace(draft=None))
    monkeypatch.setattr(bench, "run_bench", lambda pair, prompts, ks, n, *a, **kw: ran.append(
        ([p["prompt"] for p in prompts], ks, n)) or loaded())
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"class": c, "prompt": p} for c, p in (("a", "1"), ("a", "2"), ("b", "3"),
                                                                        ("a", "4"))]))
    for tokens, expected in (("64", 32), ("8", 8)):
        with pytest.raises(Loaded):
            main(["bench", "--quick", "--prompts", str(path), "--max-new-tokens", tokens])
        assert ran.pop() == (["1", "3"], (4,), expected)


def test_a_model_folder_without_a_tokenizer_is_named_as_such(model_dirs, tmp_path):
    """transformers makes an empty tokenizer where a folder has none: the pair was then called
    incompatible, or the prompt's ids out of range."""
    import shutil

    from specviz.loading import load_pair

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dirs["target"] / name, bare / name)
    with pytest.raises(ValueError, match="it has no tokenizer .* copy the model's tokenizer files"):
        load_pair(str(bare), str(model_dirs["draft"]), device="cpu", dtype="float32")


def test_costs_measures_the_draft_formats_its_dtype_serves(model_dirs, monkeypatch):
    """--dtype float16 timed every target width, then failed on an int8 draft it was never asked
    for ("auto" measures each format the draft's device and dtype serve)."""
    from specviz import costs

    asked = []
    monkeypatch.setattr(costs, "measure", lambda pair, repeats, formats: asked.append(formats) or loaded())
    argv = ["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
            "--device", "cpu"]
    for dtype, formats in (("float16", ("none",)), ("float32", ("none", "int8", "int4"))):
        with pytest.raises(Loaded):
            main([*argv, "--dtype", dtype])
        assert asked.pop() == formats


def test_costs_refuses_a_profile_it_would_not_print(model_dirs, capsys):
    """--json --profile printed the JSON and dropped the profile; --profile on a pair without a
    draft printed nothing of it. Each now says what to change."""
    target = ["costs", "--target", str(model_dirs["target"]), "--device", "cpu", "--dtype", "float32"]
    fails_with_one_line([*target, "--json", "--profile"], capsys)  # before loading
    rc = main([*target, "--profile"])  # after loading (its bars on stderr): the pair has no draft
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("specviz: error: --profile profiles the draft's"), last


def test_the_app_refuses_a_draft_without_its_target_before_serving():
    """`python app.py --draft D` served the embedded pair, D unused and unsaid."""
    import app

    with pytest.raises(SystemExit, match="specviz: error: --draft drafts for --target: give --target MODEL"):
        app.parse_args(["--draft", "some/draft"])
    assert app.parse_args(["--target", "t", "--draft", "d"]).draft == "d"


def test_the_app_refuses_a_device_it_cannot_use_before_serving():
    """A mistyped --device printed a preload error, then served a page whose every job failed."""
    import app

    with pytest.raises(SystemExit, match="specviz: error: unknown device 'tpu'.*use cpu, cuda or mps"):
        app.main(["--device", "tpu"])


def test_the_app_refuses_an_operators_mistyped_limit_in_one_line_before_serving(monkeypatch):
    """SPECVIZ_MAX_NEW_TOKENS=lots stopped start-up with a traceback, its message on the last line."""
    import app

    monkeypatch.setattr(app, "build", lambda *a, **k: pytest.fail("built the page"))
    for name, value, message in (
            ("SPECVIZ_MAX_NEW_TOKENS", "lots", "SPECVIZ_MAX_NEW_TOKENS='lots' is not a whole number: "
                                               "give one"),
            ("SPECVIZ_TRUST_FORWARDED", "10.0.0.x", "give 0, 1 or the proxies' networks"),
            ("FORWARDED_ALLOW_IPS", "*", "name your proxies in SPECVIZ_TRUST_FORWARDED"),
            # a mistyped switch read as off, silently (the safe default, yet not what was meant)
            ("SPECVIZ_ALLOW_CUSTOM_MODELS", " ture", "SPECVIZ_ALLOW_CUSTOM_MODELS='ture' is not a switch: "
                                                     "give 1 or 0"),
            ("SPECVIZ_ALLOW_LARGE_MODELS", "maybe", "SPECVIZ_ALLOW_LARGE_MODELS='maybe' is not a switch"),
            ("SPECVIZ_IN_CONTAINER", "y", "SPECVIZ_IN_CONTAINER='y' is not a switch")):
        monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit, match=f"specviz: error: .*{re.escape(message)}"):
            app.main(["--device", "cpu"])
        monkeypatch.delenv(name)


def test_the_apps_help_prints_whatever_the_environment_holds_and_a_space_reads_its_switch_too(
        monkeypatch, capsys):
    """`python app.py --help` stopped on a mistyped switch instead of printing its help, and on a
    Space (SPACE_ID set) a mistyped SPECVIZ_IN_CONTAINER was never read. GRADIO_SERVER_PORT=lots
    ended start-up in a traceback, and a port past 65535 reached the server. The flags are read
    first, then the environment, each mistyped value named."""
    import app

    monkeypatch.setenv("SPECVIZ_IN_CONTAINER", "y")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "lots")
    with pytest.raises(SystemExit) as done:
        app.parse_args(["--help"])
    assert done.value.code == 0 and "GRADIO_SERVER_PORT" in capsys.readouterr().out
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    with pytest.raises(SystemExit, match="SPECVIZ_IN_CONTAINER='y' is not a switch"):
        app.parse_args([])
    monkeypatch.setenv("SPECVIZ_IN_CONTAINER", "1")
    for value in ("lots", "70000", "0", "-1", "٨٠٨٠"):
        monkeypatch.setenv("GRADIO_SERVER_PORT", value)
        with pytest.raises(SystemExit, match=f"specviz: error: GRADIO_SERVER_PORT={re.escape(repr(value))} "
                                             "is not a port: give a whole number from 1 to 65535"):
            app.parse_args([])
    with pytest.raises(SystemExit, match="--port='x' is not a port"):
        app.parse_args(["--port", "x"])
    monkeypatch.setenv("GRADIO_SERVER_PORT", " 8080 ")
    assert app.parse_args([]).port == 8080 and app.parse_args(["--port", "9000"]).port == 9000
    monkeypatch.delenv("GRADIO_SERVER_PORT")
    assert app.parse_args([]).port == 7860


def test_the_app_listens_beyond_this_machine_only_in_a_container_or_a_space(monkeypatch):
    """The app's default host: this machine alone (127.0.0.1), unless a container or a Space says
    otherwise (SPECVIZ_IN_CONTAINER=1, SPACE_ID), where its port is reached from outside (0.0.0.0).
    SPECVIZ_IN_CONTAINER=0 is a switch set off: the app stays on this machine. GRADIO_SERVER_NAME
    and --host win."""
    import app

    for name in ("SPACE_ID", "SPECVIZ_IN_CONTAINER", "GRADIO_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert app.parse_args([]).host == "127.0.0.1"
    for value, host in (("0", "127.0.0.1"), ("off", "127.0.0.1"), (" ", "127.0.0.1"), ("1", "0.0.0.0"),
                        ("Yes", "0.0.0.0")):
        monkeypatch.setenv("SPECVIZ_IN_CONTAINER", value)
        assert app.parse_args([]).host == host, value
    monkeypatch.setenv("SPECVIZ_IN_CONTAINER", "0")
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    assert app.parse_args([]).host == "0.0.0.0"
    monkeypatch.setenv("GRADIO_SERVER_NAME", "10.1.2.3")
    assert app.parse_args([]).host == "10.1.2.3"
    assert app.parse_args(["--host", "::1"]).host == "::1"


def test_running_out_of_memory_is_one_line_that_names_the_fix(monkeypatch, capsys):
    """torch's OutOfMemoryError (a RuntimeError) went past main as a traceback."""
    import torch

    from specviz import loading

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(loading, "load_pair", full)
    assert main(["run", "--target", "T", "--draft", "D", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specviz: error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)")
    assert len(err.strip().splitlines()) == 1 and "pick a smaller pair, fewer --max-new-tokens" in err

    def cleanup_failed(*args, **kwargs):  # raised while handling the memory's: that one is quoted
        try:
            full()
        except RuntimeError:
            raise RuntimeError("cleanup failed")  # noqa: B904 - an implicit cause, as a finally's

    monkeypatch.setattr(loading, "load_pair", cleanup_failed)
    assert main(["run", "--target", "T", "--draft", "D", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specviz: error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)")
    assert "cleanup failed" not in err

    def broken(*args, **kwargs):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(loading, "load_pair", broken)  # not a user's: raised as it is
    with pytest.raises(RuntimeError, match="some other failure"):
        main(["run", "--target", "T", "--draft", "D", "x"])


def test_run_defaults_are_the_documented_ones():
    from specviz.cli import build_parser

    args = build_parser().parse_args(["run", "def f"])
    assert (args.proposer, args.k, args.max_new_tokens, args.temperature, args.top_p, args.top_k, args.seed,
            args.ngram, args.draft_quant, args.chat) == ("draft", 4, 64, 0.0, 1.0, 0, 0, 3, "auto", False)
    assert args.nodes is None and args.branching is None  # a tree sized and widened as it runs


def fake_run(monkeypatch, spec_events, base_events):
    """cmd_run on a stand-in pair and engine: what generate, encode and compare were handed."""
    from types import SimpleNamespace

    from specviz import cli, engine, render, store

    calls = {"generate": [], "encode": []}
    pair = SimpleNamespace(target_name="T", draft_name="D", dtype="float32", device="cpu", numerics="N",
                           tokenizer=SimpleNamespace(decode=lambda ids: f"{len(ids)} tokens"),
                           encode=lambda prompt, chat: calls["encode"].append((prompt, chat)) or [1, 2])

    def generate(p, prompt_ids, proposer, **kw):
        calls["generate"].append((proposer, kw))
        return iter(base_events if proposer == "none" else spec_events)

    monkeypatch.setattr(cli, "load_from_args", lambda args: pair)
    monkeypatch.setattr(store, "warm_up", lambda pair, k: None)
    monkeypatch.setattr(engine, "generate", generate)
    monkeypatch.setattr(render, "all_spans", lambda *a: [])
    monkeypatch.setattr(render, "to_ansi", lambda spans, **kw: "TEXT")
    return calls


def test_cli_run_hands_every_setting_to_the_engine(monkeypatch, capsys):
    calls = fake_run(monkeypatch, [event(1, 2, k=3)], [])
    assert main(["run", "--proposer", "tree", "--k", "3", "--max-new-tokens", "5", "--temperature", "0.5",
                 "--top-p", "0.9", "--top-k", "7", "--seed", "11", "--ngram", "2", "--chat", "--nodes", "6",
                 "--branching", "2", "--json", "def f"]) == 0
    assert calls["encode"] == [("def f", True)]
    assert calls["generate"] == [("tree", dict(k=3, max_new_tokens=5, temperature=0.5, top_k=7, top_p=0.9,
                                               seed=11, chat=True, ngram_size=2, nodes=6, branching=2))]
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (summary["target"], summary["draft"], summary["text"]) == ("T", "D", "3 tokens")


def test_cli_run_reports_a_baselines_speedup_and_where_its_output_differs(monkeypatch, capsys):
    """By hand: 3 tokens in 1.0 s against the baseline's 2 in 2.0 s: 3 tok/s over 1, 3x; the
    compared outputs differ at index 2, the third output token, with margins 0.5 and 0.25."""
    from types import SimpleNamespace

    from specviz import compare

    spec = [event(1, 2)]  # 2 drafts kept and the target's token: 3 tokens at 1.0 s
    base = [replace(event(1, 0, k=0), elapsed=1.0), replace(event(2, 0, k=0), elapsed=2.0)]
    calls = fake_run(monkeypatch, spec, base)
    compared = []
    differs = SimpleNamespace(identical=False, position=2, verdict="unexplained: please report",
                              spec_top2=0.5, base_top2=0.25, margin=lambda top2: top2)
    monkeypatch.setattr(compare, "compare", lambda *a: compared.append(a[2:]) or differs)
    argv = ["run", "--k", "2", "--max-new-tokens", "3", "--compare-baseline", "def f"]
    assert main(argv + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [proposer for proposer, _ in calls["generate"]] == ["draft", "none"]
    assert compared == [("float32", "cpu", "N")]
    assert (summary["baseline_tokens_per_second"], summary["speedup"]) == (1.0, 3.0)
    assert (summary["identical_to_baseline"], summary["first_difference"], summary["compared"]) \
        == (False, 2, "N")
    assert (summary["margin_speculative"], summary["margin_baseline"]) == (0.5, 0.25)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3 tokens in 1 target passes" in out
    assert ("baseline: 1.00 tok/s, speedup 3.00x; output DIFFERENT from output token 3 on: unexplained: "
            "please report (top-2 logit margin 0.5 speculative, 0.25 baseline)\ncompared: N\n") in out


def test_a_file_error_is_exit_status_1_and_one_line_and_presets_exits_0(monkeypatch, capsys):
    from specviz import loading, presets

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loading, "load_pair", full)
    assert main(["run", "--target", "T", "--draft", "D", "x"]) == 1
    err = capsys.readouterr().err
    assert err == "specviz: error: [Errno 28] No space left on device\n"
    monkeypatch.setattr(presets, "listing", lambda: [])
    assert main(["presets"]) == 0


def test_load_from_args_hands_every_model_argument_to_the_load(monkeypatch):
    from specviz import cli, loading, presets

    seen = []
    monkeypatch.setattr(loading, "load_pair", lambda *a, **kw: seen.append(("pair", a, kw)))
    monkeypatch.setattr(presets, "load", lambda *a, **kw: seen.append(("preset", a, kw)))
    model = ["--device", "cpu", "--dtype", "bfloat16", "--device-map", "auto", "--draft-quant", "int8"]
    cli.load_from_args(cli.build_parser().parse_args(["run", "--target", "T", "--draft", "D", *model, "x"]))
    cli.load_from_args(cli.build_parser().parse_args(["run", "--pair", "embedded", *model, "x"]))
    kwargs = dict(device="cpu", dtype="bfloat16", device_map="auto", draft_quant="int8")
    assert seen == [("pair", ("T", "D"), kwargs), ("preset", ("embedded",), kwargs)]


def test_check_writable_refuses_a_folder_it_cannot_write_in(tmp_path, monkeypatch):
    from specviz import cli

    cli.check_writable("--json", str(tmp_path / "b.json"))  # a folder it can write: fine
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)  # read-only (root may write anyway)
    with pytest.raises(ValueError, match=r"--json .*b\.json: cannot write a file there"):
        cli.check_writable("--json", str(tmp_path / "b.json"))


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["presets", "--help"]])
def test_help_imports_no_torch_transformers_or_gradio(argv):
    """`python -m specviz --help` and `run --help` imported torch and transformers (the package's
    __init__ imported the engine, and the parser bench's, costs' and gpucheck's modules for their
    arguments): 8-10 s of a 2-core machine before a line of help."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "specviz", *argv], capture_output=True,
                          text=True, cwd=Path(__file__).parent.parent, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m specviz")
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert not imported & {"torch", "transformers", "gradio"}


def test_the_packages_names_load_on_first_use_and_are_what_they_were():
    """`import specviz` loads no torch (its names load on first use): each name of its API is the
    object it was, a submodule is reached as an attribute after `import specviz` alone (as when
    the package imported the engine), dir() and `import *` list the API, and a name that is not
    there, or a private one (__main__ would run the command line), is an AttributeError (hasattr
    false), in a fresh interpreter."""
    check = """
import sys
import specviz
assert "torch" not in sys.modules
assert specviz.bounds.MAX_NODES == 64 and "torch" not in sys.modules  # a submodule, not yet imported
assert set(specviz.__all__) <= set(dir(specviz)), dir(specviz)
assert not hasattr(specviz, "no_such_name") and not hasattr(specviz, "_no_such_module")
assert not hasattr(specviz, "__main__")  # a private name: the command line is not run for it
from specviz import engine, loading, metrics, sampling
assert (specviz.Pair, specviz.load_pair) == (loading.Pair, loading.load_pair)
assert (specviz.RoundEvent, specviz.generate) == (engine.RoundEvent, engine.generate)
assert (specviz.RunStats, specviz.SamplingParams) == (metrics.RunStats, sampling.SamplingParams)
names = {}
exec("from specviz import *", names)
assert {n for n in names if n != "__builtins__"} == set(specviz.__all__)
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_subcommands_built_on_demand_parse_and_show_their_arguments(capsys):
    """bench, costs and gpucheck get their arguments when asked for: parsed and shown as before."""
    args = build_parser().parse_args(["bench", "--quick", "--ks", "2,4", "--target", "t"])
    assert (args.command, args.quick, args.ks, args.target) == ("bench", True, "2,4", "t")
    assert args.draft_quant == "auto" and args.max_new_tokens == 64
    assert build_parser().parse_args(["gpucheck", "--quick"]).compile == "auto"
    assert build_parser().parse_args(["costs", "--repeats", "3"]).repeats == 3
    with pytest.raises(SystemExit) as e:
        main(["costs", "--help"])
    assert e.value.code == 0 and "--repeats" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["bench", "--no-such-flag"])
    assert e.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["gpucheck", "--compile", "sometimes"])
    assert e.value.code == 2 and "--compile" in capsys.readouterr().err


def test_the_subcommands_built_on_demand_are_the_parsers_they_were(capsys):
    """bench, costs and gpucheck each get their own module's arguments, as when the parser added
    them at once: the same usage and help, asked of the subcommand's parser directly (as a docs or
    completion tool does) or shown by --help."""
    import argparse

    from specviz import cli
    from specviz.bench import add_bench_args
    from specviz.costs import add_costs_args
    from specviz.gpucheck import add_gpucheck_args

    def subcommand(name):
        action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        return action.choices[name]

    for name, add in (("bench", add_bench_args), ("costs", add_costs_args), ("gpucheck", add_gpucheck_args)):
        eager = cli._Parser(prog=f"python -m specviz {name}")
        add(eager)
        assert subcommand(name).format_usage() == eager.format_usage(), name
        assert subcommand(name).format_help() == eager.format_help(), name
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert capsys.readouterr().out == eager.format_help(), name


def test_the_apps_port_is_any_of_1_to_65535_and_a_blank_environment_value_is_unset(monkeypatch):
    """Every TCP port from 1 to 65535 is taken, from the flag or GRADIO_SERVER_PORT, spaces around
    it dropped; 65536 is refused. GRADIO_SERVER_PORT or GRADIO_SERVER_NAME of spaces alone (an
    operator's `GRADIO_SERVER_PORT= `) reads as unset: port 7860, the default host."""
    import app

    for name in ("SPACE_ID", "SPECVIZ_IN_CONTAINER", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert [app.parse_args(["--port", p]).port for p in ("1", "65535", " 8000 ")] == [1, 65535, 8000]
    with pytest.raises(SystemExit, match="--port='65536' is not a port"):
        app.parse_args(["--port", "65536"])
    monkeypatch.setenv("GRADIO_SERVER_PORT", "65535")
    assert app.parse_args([]).port == 65535
    monkeypatch.setenv("GRADIO_SERVER_PORT", "   ")
    monkeypatch.setenv("GRADIO_SERVER_NAME", "  ")
    args = app.parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 7860)


@pytest.mark.parametrize("prompts, message", [
    ([{"class": "code", "prompt": "def f"}, {"class": "text", "prompt": "  "}],
     "prompt #1 is empty: give it some text"),  # said after the model load
    ([{"class": "all", "prompt": "def f"}], "a class is named 'all', the report's row over every class"),
])
def test_bench_prompts_that_cannot_work_fail_before_loading(prompts, message, tmp_path, monkeypatch, capsys):
    import json

    from specviz import loading

    monkeypatch.setattr(loading, "load_pair", loaded)
    (tmp_path / "p.json").write_text(json.dumps(prompts))
    assert main(["bench", "--prompts", str(tmp_path / "p.json")]) == 2
    assert message in capsys.readouterr().err


def test_bench_refuses_transformers_on_a_quantized_draft_that_is_not_quantized(model_dirs, tmp_path, capsys):
    """--methods hf:assisted-4-qdraft with the draft left as loaded: it ran nothing without a word
    (beside hf:target), or failed with "max() arg is an empty sequence" alone."""
    argv = ["bench", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
            "--dtype", "float32", "--device", "cpu", "--ks", "4", "--draft-quant", "none",
            "--json", str(tmp_path / "b.json")]
    for methods in ("hf:assisted-4-qdraft", "hf:target,hf:assisted-4-qdraft"):
        assert main([*argv, "--methods", methods]) == 2
        assert "--methods hf:assisted-4-qdraft: transformers on specviz's quantized draft" in \
            capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
