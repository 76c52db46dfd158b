"""The benchmark's bookkeeping (exact, on synthetic records) and a tiny end-to-end run."""

import json
import math

import pytest
from conftest import FakeTime, TimedPasses

from specviz import bench, benchreport, costs, profiles
from specviz.bench import Record


def rec(method, family, cls, tokens, seconds, **kw):
    return Record(method, family, None, 0, cls, 0, tokens, seconds, **kw)


def test_summary_speedups_and_counterparts_are_exact():
    spec = dict(target_passes=10, alpha=0.5, draft_seconds=1.0, target_seconds=2.0, other_seconds=0.1,
                matches_target=True)
    records = [
        rec("hf:target", "transformers", "edit", 60, 20.0, matches_target=True),
        rec("specviz:none", "specviz", "edit", 60, 19.0, **spec),
        rec("hf:assisted-4", "transformers", "edit", 60, 10.0),
        rec("hf:lookup-8", "transformers", "edit", 60, 5.0),
        rec("specviz:draft-4", "specviz", "edit", 60, 8.0, **spec),
        rec("specviz:hybrid-8", "specviz", "edit", 60, 4.0, **spec),
    ]
    s = benchreport.summarize(records)
    assert s["specviz:none"]["edit"]["vs_transformers"] == 20.0 / 19.0  # tok/s ratio
    assert s["hf:assisted-4"]["edit"]["speedup"] == 2.0 and s["specviz:draft-4"]["edit"]["speedup"] == 19 / 8
    assert s["specviz:draft-4"]["edit"]["vs_transformers"] == (19 / 8) / 2.0
    # the hybrid is measured against the better of assisted (2.0x) and lookup (4.0x)
    assert s["specviz:hybrid-8"]["edit"]["vs_transformers"] == (19 / 4) / 4.0
    assert s["specviz:draft-4"]["all"]["tokens_per_pass"] == 6.0
    text = benchreport.markdown(s, {"machine": bench.machine(), "target": "t", "draft": "d", "dtype": "bf16",
                              "device": "cpu", "max_new_tokens": 64, "repeats": 1})
    assert "| specviz:hybrid-8 |" in text and "1.19 vs hf" in text
    assert "| 1/1 |" in text.split("| specviz:draft-4 | 6.00")[1].split("\n")[0]


def test_the_report_names_the_transformers_method_each_class_measured_the_hybrid_against():
    """The hybrid's "vs hf" is over the best of assisted (any k) and prompt lookup, which can be
    another in each class. chat: assisted-4 2x, assisted-8 20/12 = 1.67x, lookup 1.33x; write:
    lookup 4x; all (120 tokens each): every one 2x, a tie the name decides. The draft at k = 4 has
    one counterpart: no line."""
    records = []
    for cls, (a4, a8, l8) in {"chat": (10, 12, 15), "write": (10, 8, 5)}.items():
        records += [rec(m, "transformers" if m.startswith("hf:") else "specviz", cls, 60, seconds)
                    for m, seconds in (("hf:target", 20.0), ("specviz:none", 20.0), ("hf:assisted-4", a4),
                                       ("hf:assisted-8", a8), ("hf:lookup-8", l8), ("specviz:hybrid-8", 4.0),
                                       ("specviz:draft-4", 8.0))]
    s = benchreport.summarize(records)
    rows = s["specviz:hybrid-8"]
    hybrid = [(rows[c]["vs_transformers"], rows[c]["vs_transformers_method"]) for c in rows]
    assert hybrid == [(2.5, "hf:assisted-4"), (1.25, "hf:lookup-8"), (2.5, "hf:lookup-8")]
    line = "specviz:hybrid-8's vs hf is against hf:assisted-4 (chat); hf:lookup-8 (write, all)"
    assert benchreport.measured_against(s) == line
    assert benchreport.table(s).endswith("\n" + line)
    meta = {"machine": bench.machine(), "target": "t", "draft": "d", "dtype": "bf16", "device": "cpu",
            "max_new_tokens": 64, "repeats": 1}
    assert f"\n\n{line}\n\n| method | tokens/pass |" in benchreport.markdown(s, meta)


def test_bench_alpha_pools_the_tested_drafts_of_every_run():
    """α per class is accepted / (accepted + rejections) over all its runs, as RunStats takes it
    over rounds, not the mean of each run's α; the target alone, which tests nothing, has none."""
    # k = 4: one run keeps all 16 drafts of its 4 rounds (α 1), one refuses the first draft of
    # each of its 2 rounds (α 0)
    spec = dict(draft_seconds=0.4, target_seconds=0.4, other_seconds=0.2)
    records = [rec("specviz:draft-4", "specviz", "c", tokens, 1.0, target_passes=passes, alpha=alpha,
                   nodes_verified=4 * passes, accepted=accepted, rejections=rejections, **spec)
               for tokens, passes, alpha, accepted, rejections in ((20, 4, 1.0, 16, 0), (2, 2, 0.0, 0, 2))]
    records.append(rec("specviz:none", "specviz", "c", 64, 20.0, target_passes=64, alpha=0.0,
                       nodes_verified=0, accepted=0, rejections=0, **spec))
    s = benchreport.summarize(records)
    assert s["specviz:draft-4"]["all"]["alpha"] == pytest.approx(16 / 18)  # not (1 + 0) / 2
    assert "alpha" not in s["specviz:none"]["all"]
    text = benchreport.markdown(s, {"machine": bench.machine(), "target": "t", "draft": "d", "dtype": "bf16",
                                    "device": "cpu", "max_new_tokens": 64, "repeats": 1})
    assert "| 0.89 |" in text.split("| specviz:draft-4 |")[-1].split("\n")[0]
    assert "| - |" in text.split("| specviz:none |")[-1].split("\n")[0]
    # records written before they carried rejections: the mean of their α, as before
    older = [rec("specviz:draft-4", "specviz", "c", 5, 1.0, target_passes=1, alpha=a, **spec)
             for a in (1.0, 0.0)]
    assert benchreport.summarize(older)["specviz:draft-4"]["all"]["alpha"] == 0.5


def test_a_speedup_just_under_parity_never_prints_as_the_baselines_1_00x():
    """1000 tokens in 100 s against 996 in 100 s: 0.996x, which two decimals printed as "1.00x"
    beside the baseline's own 1.00x (in the text table, the markdown and the projections)."""
    spec = dict(target_passes=500, alpha=0.5, draft_seconds=1.0, target_seconds=90.0, other_seconds=0.1)
    records = [rec("specviz:none", "specviz", "text", 1000, 100.0, **spec),
               rec("specviz:ngram-8", "specviz", "text", 996, 100.0, **spec),
               rec("specviz:draft-4", "specviz", "text", 1020, 100.0, **spec)]
    s = benchreport.summarize(records)
    assert s["specviz:ngram-8"]["text"]["speedup"] == pytest.approx(0.996)
    printed = benchreport.table(s)
    assert "0.996x" in printed.split("specviz:ngram-8")[1].split("\n")[0]
    assert "1.02x" in printed.split("specviz:draft-4")[1].split("\n")[0]  # two decimals where they do
    assert "0.996x" in benchreport.markdown(s, META)
    assert benchreport._times(1.0) == "1.00x" and benchreport._times(None) == "-"


def test_a_trees_alpha_is_not_printed_as_a_chains():
    """A tree's accepted / (accepted + refused siblings) is the share of tried candidates kept: read
    as a chain's α it predicted 1.47 tokens a pass where the tree made 1.60. The tree table shows
    accepted per node instead."""
    spec = dict(target_passes=10, draft_seconds=1.0, target_seconds=2.0, other_seconds=0.1,
                nodes_verified=26, accepted=9, rejections=17, alpha=9 / 26)
    s = benchreport.summarize([rec("specviz:tree-2", "specviz", "c", 16, 4.0, **spec),
                               rec("specviz:draft-2", "specviz", "c", 12, 4.0, **spec)])
    text = benchreport.markdown(s, META)
    assert "| 0.35 |" not in text.split("| specviz:tree-2 |")[-1].split("\n")[0]
    assert "| 0.35 |" in text.split("| specviz:draft-2 |")[-1].split("\n")[0]


def test_runs_without_their_target_alone_say_not_compared_instead_of_zero_matches():
    spec = dict(target_passes=10, alpha=0.5, draft_seconds=1.0, target_seconds=2.0, other_seconds=0.1)
    s = benchreport.summarize([rec("specviz:draft-4", "specviz", "edit", 60, 8.0, **spec)])
    assert s["specviz:draft-4"]["all"]["compared"] == 0
    text = benchreport.markdown(s, {"machine": bench.machine(), "target": "t", "draft": "d", "dtype": "bf16",
                              "device": "cpu", "max_new_tokens": 64, "repeats": 1})
    assert "not compared (its target alone did not run) |" in text and "| 0/1 |" not in text


META = {"machine": bench.machine(), "target": "t", "draft": "d", "dtype": "bf16", "device": "cpu",
        "max_new_tokens": 64, "repeats": 1}


def test_counterparts_without_hf_target_give_no_vs_hf_figure_instead_of_a_crash():
    """--methods specviz:draft-4,hf:assisted-4: assisted ran but hf:target did not, so it has no
    speedup to be measured against."""
    spec = dict(target_passes=10, alpha=0.5, draft_seconds=1.0, target_seconds=2.0, other_seconds=0.1)
    records = [rec("specviz:none", "specviz", "edit", 60, 20.0, **spec),
               rec("hf:assisted-4", "transformers", "edit", 60, 10.0),
               rec("specviz:draft-4", "specviz", "edit", 60, 8.0, **spec),
               rec("hf:lookup-8", "transformers", "edit", 60, 5.0),
               rec("specviz:ngram-8", "specviz", "edit", 60, 6.0, **spec)]
    s = benchreport.summarize(records)
    assert s["specviz:draft-4"]["edit"]["speedup"] == 20 / 8  # 7.5 against 3 tok/s
    assert "speedup" not in s["hf:assisted-4"]["edit"]
    assert all("vs_transformers" not in row for rows in s.values() for row in rows.values())
    text = benchreport.markdown(s, META)
    assert "| specviz:draft-4 | 7.50 tok/s, 2.50x | 7.50 tok/s, 2.50x |" in text
    assert "| specviz:ngram-8 | 10.00 tok/s, 3.33x | 10.00 tok/s, 3.33x |" in text
    assert "| hf:assisted-4 | 6.00 tok/s, - | 6.00 tok/s, - |" in text and "vs hf" not in text
    line = next(x for x in benchreport.table(s).splitlines() if x.startswith("specviz:draft-4 "))
    assert line.split() == ["specviz:draft-4", "7.50", "2.50x", "-", "7.50", "2.50x", "-"]


def test_plainhead_speedups_are_over_its_own_target_alone_and_against_assisted_at_its_k():
    """none 20 tokens in 2 s (10 tok/s), none-plainhead 20 in 4 s (5 tok/s), draft-4-plainhead 20
    in 2 s (10 tok/s): 2.00x over the plain head's target alone, not 1.00x over the refined
    head's. hf:target 20 in 5 s (4 tok/s), hf:assisted-4 20 in 4 s (5 tok/s): 1.25x, so the plain
    head's draft-4 is 2.00 / 1.25 = 1.60x transformers'."""
    plain = bench.PLAIN_HEAD
    records = [rec("specviz:none", "specviz", "code", 20, 2.0),
               rec("specviz:none-plainhead", plain, "code", 20, 4.0),
               rec("specviz:draft-4-plainhead", plain, "code", 20, 2.0),
               rec("hf:target", "transformers", "code", 20, 5.0),
               rec("hf:assisted-4", "transformers", "code", 20, 4.0)]
    s = benchreport.summarize(records)
    assert s["specviz:draft-4-plainhead"]["all"]["speedup"] == 2.0
    assert s["specviz:none-plainhead"]["all"]["speedup"] == 1.0
    assert s["hf:assisted-4"]["all"]["speedup"] == 1.25
    assert benchreport.counterparts("specviz:draft-4-plainhead", s) == ["hf:assisted-4"]
    assert s["specviz:draft-4-plainhead"]["all"]["vs_transformers"] == 1.6
    assert "| specviz:draft-4-plainhead | 10.00 tok/s, 2.00x, 1.60 vs hf |" in benchreport.markdown(s, META)


def test_bench_runs_end_to_end_on_tiny_models(model_dirs, tmp_path, capsys):
    from specviz.cli import main

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "def fibonacci(n):"},
                                   {"class": "text", "prompt": "The dog. The dog."}]))
    out = tmp_path / "b.json"
    rc = main(["bench", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--prompts", str(prompts), "--ks", "2",
               "--max-new-tokens", "12", "--json", str(out), "--markdown", str(tmp_path / "b.md"),
               "--html", str(tmp_path / "b.html")])
    assert rc == 0
    data = json.loads(out.read_text())
    methods = {r["method"] for r in data["records"]}
    assert {"hf:target", "specviz:none", "hf:assisted-2", "specviz:draft-2", "specviz:ngram-8",
            "hf:lookup-8", "specviz:hybrid-8", "specviz:adaptive", "specviz:tree-2",
            "hf:assisted-4-qdraft"} - methods \
        == {"hf:assisted-4-qdraft"}  # quantized-draft counterpart only when k=4 is benchmarked
    # float32 tiny models: every method reproduces the target alone exactly; the target alone's run
    # that sets its family's reference is compared with nothing (it matched itself: "2/2" compared 0)
    # specviz's target alone is compared with transformers': the same tokens
    assert {r["method"] for r in data["records"] if r["matches_target"] is None} == {"hf:target"}
    assert "hf_assisted" not in data["meta"]  # one vocabulary: transformers' own assisted path
    assert all(r["matches_target"] for r in data["records"] if r["method"] != "hf:target")
    assert "| specviz:none | " in (tmp_path / "b.md").read_text()
    assert "the reference (its first run of each prompt) |" in (tmp_path / "b.md").read_text()
    # transformers' target passes are counted like specviz's: one per token alone, fewer with help
    by = {(r["method"], r["prompt"]): r for r in data["records"]}
    for i in (0, 1):
        assert by["hf:target", i]["target_passes"] == by["hf:target", i]["tokens"]
        assert by["hf:target", i]["target_passes"] == by["specviz:none", i]["target_passes"]
        assert 1 <= by["hf:assisted-2", i]["target_passes"] <= by["hf:target", i]["tokens"]
    assert data["summary"]["hf:target"]["all"]["tokens_per_pass"] == 1.0
    # --draft-quant auto on CPU: specviz drafts with int4 weights, transformers with the draft as loaded
    assert "int4" in data["meta"]["specviz_draft"] and "int4" not in data["meta"]["draft"]
    # both n-gram rules replayed on the target's own text: at least one token per pass
    assert set(data["same_text_passes"]) == {"code", "text"}
    for row in data["same_text_passes"].values():
        assert set(row) == {"specviz:ngram-8", "hf:lookup-8"}
        assert all(1 <= n <= 12 for n in row.values())
    assert "fewer is better" in (tmp_path / "b.md").read_text()
    assert "specviz:draft-2" in (tmp_path / "b.md").read_text()
    assert (tmp_path / "b.html").stat().st_size > 1000


def test_a_run_past_the_models_positions_is_refused_before_any_method_runs(pair):
    """transformers' methods generated 300 tokens past a 256-position target (a warning only),
    then a specviz method refused it: on a 32k-position pair, hours before the error."""
    from specviz.bench import run_bench

    prompts = [{"class": "code", "prompt": "def fibonacci(n):"}]
    lines = []
    with pytest.raises(ValueError, match=r"max_new_tokens \(300\) needs .* positions, past"):
        run_bench(pair, prompts, ks=(2,), max_new_tokens=300, names={"hf:target", "specviz:none"},
                  log=lines.append)
    assert lines == []
    records, _, _ = run_bench(pair, prompts, ks=(2,), max_new_tokens=4, names={"specviz:none"},
                              log=lines.append)
    assert [r.tokens for r in records] == [4] and len(lines) == 1
    # the draft's positions bound every method that runs it (hybrid and adaptive were missed)
    from specviz.bench import uses_draft

    assert [uses_draft(m) for m in ("specviz:hybrid-8", "specviz:adaptive", "specviz:draft-4",
                                    "specviz:tree-4-n16", "hf:assisted-4-qdraft")] == [True] * 5
    assert not any(uses_draft(m) for m in ("specviz:none", "specviz:ngram-8", "hf:target", "hf:lookup-8",
                                           "specviz:none-plainhead"))


def test_a_base_model_without_a_chat_template_is_benchmarked_on_its_plain_prompts(pair):
    """Every bench prompt went through the chat template: a base model (the gpt2 and pythia
    presets) failed after its load with "has no chat template: turn chat off", a flag the bench
    does not have. Its prompts are now read as text; a tokenizer with a template still uses it."""
    import copy
    from dataclasses import replace

    import specviz

    tokenizer = copy.deepcopy(pair.tokenizer)
    tokenizer.chat_template = None
    plain = replace(pair, tokenizer=tokenizer)
    prompts = [{"class": "code", "prompt": "def fibonacci(n):"}]
    for on, chat in ((plain, False), (pair, True)):
        records, texts, _ = bench.run_bench(on, prompts, ks=(2,), max_new_tokens=4, names={"specviz:none"},
                                         log=[].append)
        ids = pair.encode(prompts[0]["prompt"], chat=chat)
        run = specviz.generate(pair, ids, proposer="none", max_new_tokens=4)
        alone = [t for e in run for t in e.new_tokens]
        assert [r.tokens for r in records] == [4] and texts == {0: alone}
        assert bench.encode(on, prompts[0]["prompt"]) == ids and bench.chats(on) == chat
        assert set(bench.same_text_passes(on, prompts, texts, 4)) == {"code"}


def test_a_bench_reports_whether_its_prompts_went_through_a_chat_template(model_dirs, tmp_path):
    """The report's meta says how the prompts were read: a base model's (no chat template) as
    plain text, "chat": false, so that its figures are not taken for chat-formatted runs."""
    import shutil

    from specviz.cli import main

    base = tmp_path / "base"
    shutil.copytree(model_dirs["target"], base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    (base / "chat_template.jinja").unlink(missing_ok=True)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "def fibonacci(n):"}]))
    for target, chat in ((base, False), (model_dirs["target"], True)):
        out = tmp_path / f"{chat}.json"
        rc = main(["bench", "--target", str(target), "--dtype", "float32", "--device", "cpu", "--prompts",
                   str(prompts), "--ks", "2", "--methods", "specviz:none", "--max-new-tokens", "2",
                   "--json", str(out)])
        assert rc == 0 and json.loads(out.read_text())["meta"]["chat"] is chat


def test_costs_report_every_format_and_verified_length(model_dirs, capsys):
    from specviz.cli import main

    rc = main(["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--repeats", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["draft_ms"]) == {"none", "int8", "int4"}
    assert [int(n) for n in out["target_ms"]] == [1, 2, 3, 5, 9, 17, 33, 65]
    assert all(ms > 0 for ms in [*out["draft_ms"].values(), *out["target_ms"].values()])
    assert out["verify_fit"] == costs.verify_fit(out["target_ms"])
    assert "note" not in out  # on the CPU the engine runs eager too: these are its passes
    # a format asked for is the only one timed; auto times only "none" where the weight formats are
    # not served (float16)
    for dtype, quant, timed in (("float32", "int8", {"int8"}), ("float16", "auto", {"none"})):
        rc = main(["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
                   "--dtype", dtype, "--device", "cpu", "--repeats", "1", "--draft-quant", quant, "--json"])
        assert rc == 0 and set(json.loads(capsys.readouterr().out)["draft_ms"]) == timed
    rc = main(["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--repeats", "1", "--profile"])
    assert rc == 0 and "Self CPU" in capsys.readouterr().out
    rc = main(["costs", "--target", str(model_dirs["target"]), "--dtype", "float32", "--device", "cpu",
               "--repeats", "1"])  # no draft: the line said "draft pass (1 token): " and nothing
    assert rc == 0 and "draft pass (1 token): no draft model (give --draft to time one)" in \
        capsys.readouterr().out


def test_costs_profile_takes_the_draft_format_asked_for(model_dirs, monkeypatch, capsys):
    """--profile profiled the default format (int4 on CPU) whatever --draft-quant said."""
    from specviz.cli import main

    asked = []
    real = costs.quant.apply
    monkeypatch.setattr(costs.quant, "apply",
                        lambda model, mode, *a: asked.append(mode) or real(model, mode, *a))
    for mode in ("none", "int8", "auto"):
        rc = main(["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
                   "--dtype", "float32", "--device", "cpu", "--repeats", "1", "--draft-quant", mode,
                   "--profile"])
        assert rc == 0 and "Self CPU" in capsys.readouterr().out
        assert asked[-1] == mode  # the profiled copy's


def test_costs_time_each_model_as_the_engine_runs_it(pair, monkeypatch):
    """The draft's passes skip the float32 head refinement (proposers.ModelProposer), the target's
    take the pair's own; a costs figure priced otherwise is not what a run pays."""
    from dataclasses import replace

    from specviz.lm import CachedLM

    made = []

    def spy(model, vocab_size, **kw):
        made.append((model, kw.get("refine", True)))
        return CachedLM(model, vocab_size, **kw)

    import specviz.lm

    monkeypatch.setattr(costs, "CachedLM", spy)  # the target's
    monkeypatch.setattr(specviz.lm, "CachedLM", spy)  # a drafter's, through lm.draft_lm
    for refine in (True, False):
        made.clear()
        costs.measure(replace(pair, refine=refine), repeats=1, draft_formats=("none",))
        assert {r for m, r in made if m is pair.target} == {refine}
        assert {r for m, r in made if m is not pair.target} == {False}
        assert sum(m is not pair.target for m, _ in made) == 1


def test_a_differing_output_is_explained_by_its_top2_margins(pair):
    from dataclasses import replace

    import specviz

    base = specviz.RunStats.of(specviz.generate(pair, "def f", proposer="none", max_new_tokens=6))
    e = base.events[3]
    (a, la), _ = e.target_top2[0]
    # the speculative run chose another token at position 3, its top two 1e-7 apart, and the
    # target alone's were 2e-7 apart there: a near-tie in both
    spec = specviz.RunStats.of(base.events[:3] + (replace(e, new_tokens=[a + 1], token=a + 1,
                                                          target_top2=[[(a + 1, la), (a, la - 1e-7)]]),))
    near = specviz.RunStats.of(base.events[:3] + (replace(e, target_top2=[[(a, la), (a + 1, la - 2e-7)]]),))
    why = bench.explain(spec, near, pair)
    assert why.startswith("near-tie flipped by floating point (top-2 margins 1e-07 / 2e-07")
    assert bench.explain(spec, base, pair).startswith("unexplained")  # the target alone's own margin
    assert bench.explain(spec, None, pair).startswith("not explained")
    records = [rec("specviz:tree-4", "specviz", "chat", 6, 1.0, matches_target=False, first_difference=3,
                   difference=why), rec("specviz:draft-4", "specviz", "chat", 6, 1.0, matches_target=True)]
    assert benchreport.differences(records).splitlines()[2] \
        == f"- specviz:tree-4, prompt #0 (chat), repeat 0: from output token 4: {why}"  # 1-based
    assert benchreport.differences(records[1:]) == ""


def test_passes_on_text_counts_rounds_exactly():
    out = [4, 5, 6, 7]
    assert bench.passes_on_text([1, 2, 3], out, lambda ids, budget: []) == 4  # one token a pass
    oracle = lambda ids, budget: out[len(ids) - 3:][:budget]  # noqa: E731
    assert bench.passes_on_text([1, 2, 3], out, oracle) == 1  # 3 kept + the target's own
    # keeps 4, 5, then the target says 6; the last round proposes nothing (no budget left)
    assert bench.passes_on_text([1, 2, 3], out, lambda ids, budget: [4, 5, 9][:budget]) == 2
    # each round may draft what is left but the target's own token: 3 of 4, then 0 of the last 1
    budgets = []
    assert bench.passes_on_text([1, 2, 3], out, lambda ids, b: budgets.append(b) or [4, 5, 9][:b]) == 2
    assert budgets == [3, 0]


def test_lookup_rules_are_transformers_and_specviz_ngram(pair):
    rules = bench.lookup_rules(pair, [5, 1, 2, 3], max_new_tokens=16)
    ids = [5, 1, 2, 3, 5]
    # transformers: the earliest match of the last 2, then 1 tokens; everything that followed
    assert rules["hf:lookup-8"](ids, 8) == [1, 2, 3, 5] and rules["hf:lookup-8"](ids, 2) == [1, 2]
    # specviz: the copy of "1 2 3 5" reads on past the context's end, as the output would go on
    assert rules["specviz:ngram-8"](ids, 8) == [1, 2, 3, 5, 1, 2, 3, 5]


def test_a_repeated_token_or_short_loop_is_proposed_k_tokens_a_round_not_cut_at_its_period():
    """ids[at:at + k] stopped at the context's end: "7 7 7 ..." was proposed one token a round (33
    target passes for 64 tokens), a loop of period 2 two a round (22). Reading on in the copy: the
    prompt's last token has no earlier copy, so the target writes the first token alone; then each
    round keeps its 8 proposed tokens and adds the target's own, 1 + 7 * 9 = 64 in 8 passes."""
    from specviz.proposers import NgramProposer

    for prompt, out in (([1, 2, 3, 7], [7] * 64), ([1, 2, 3, 7, 8], [7, 8] * 32),
                        ([1, 9, 10, 11, 12, 13], [9, 10, 11, 12, 13] * 12 + [9, 10, 11, 12])):
        drafter = NgramProposer(3)
        proposed = []

        def propose(ids, budget, drafter=drafter, proposed=proposed):
            proposed.append(drafter.proposal(ids, min(8, budget)))
            return proposed[-1]

        assert bench.passes_on_text(prompt, out, propose) == 8, (prompt, proposed)
        assert [len(p) for p in proposed] == [0] + [8] * 7


def test_the_same_text_ngram_rule_is_priced_as_the_engine_prices_it(pair, monkeypatch):
    """The same-text table replayed the n-gram drafter at the prior price (0.04 a token, no step)
    while the live specviz:ngram-8 rows drafted at the target's measured line."""
    from specviz import engine, proposers

    made = []

    class Recorded(proposers.NgramProposer):
        def __init__(self, *args):
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(proposers, "NgramProposer", Recorded)
    monkeypatch.setattr(engine, "ngram_price", lambda pair: (0.3, 0.25))
    bench.lookup_rules(pair, [5, 1, 2, 3], max_new_tokens=16)
    assert made == [(3, 0.3, 0.25)] and engine.make_proposer(pair, "ngram").slope == 0.3


def test_transformers_greedy_is_compared_without_the_models_logits_processors(pair):
    """A hub config may set repetition_penalty; generate would apply it, specviz does not. The
    bench's generate runs with every processor off, so both compute the same raw greedy."""
    import specviz

    config = pair.target.generation_config
    config.repetition_penalty, config.no_repeat_ngram_size = 1.5, 2
    try:
        ids = pair.encode("for i in range(10):")
        hf, _ = bench.hf_method("target", 0)(pair, ids, 24)
        ours = [t for e in specviz.generate(pair, ids, proposer="none", max_new_tokens=24)
                for t in e.new_tokens]
        assert hf == ours[: len(hf)] and len(hf) >= min(len(ours), 24)
        with_processors = pair.target.generate(__import__("torch").tensor([ids]), max_new_tokens=24,
                                               do_sample=False)[0, len(ids):].tolist()
        assert with_processors != hf  # the model's own config would have changed the text
        assert config.repetition_penalty == 1.5  # the model's config is left as it was
    finally:
        config.repetition_penalty, config.no_repeat_ngram_size = 1.0, 0


# ---- token trees --------------------------------------------------------------------------------

def test_tree_method_names_parse_select_and_bring_their_chain():
    assert bench.tree_method("specviz:tree-4") == (4, None, None)  # no -b: the width adapts
    assert bench.tree_method("specviz:tree-4-n16") == (4, 16, None)
    assert bench.tree_method("specviz:tree-4-n16-b3") == (4, 16, 3)
    assert bench.tree_method("specviz:tree-4-n16-b4") == (4, 16, 4)
    assert bench.tree_method("specviz:tree-2-b1") == (2, None, 1)
    assert bench.tree_method("specviz:draft-4") is None and bench.tree_method("specviz:tree-4x") is None
    for bad in ("specviz:tree-0", "specviz:tree-33", "specviz:tree-4-n0", "specviz:tree-4-n65",
                "specviz:tree-4-b9"):
        with pytest.raises(ValueError, match="specviz:tree-"):
            bench.tree_method(bad)
    assert bench.tree_method("specviz:tree-32") == (32, None, None)  # MAX_K deep
    bench.check_methods({"specviz:none-plainhead", "specviz:draft-4-plainhead"}, (4,))
    for shape in [(4, None, None), (4, 16, None), (4, 16, 3), (3, 8, 2)]:
        assert bench.tree_method(bench.tree_name(*shape)) == shape
    every = bench.methods((4,), None, True, tree_nodes=(16,))
    assert {"specviz:tree-4", "specviz:tree-4-n16"} <= set(every) and every["specviz:tree-4"][1] == 4
    assert not any(m.startswith("specviz:tree") for m in bench.methods((4,), None, False))
    assert "hf:assisted-4-qdraft" in bench.methods((2, 4), None, True, quant_draft=True)
    assert "hf:assisted-4-qdraft" not in bench.methods((2, 4), None, True, quant_draft=False)
    # a tree named alone brings the chain at its depth, whatever --ks holds
    assert set(bench.methods((2,), {"specviz:tree-4-n8-b2"}, True)) == {"specviz:tree-4-n8-b2",
                                                                        "specviz:draft-4"}
    assert set(bench.methods((4,), {"specviz:tree"}, True)) == {"specviz:tree-4", "specviz:draft-4"}
    bench.check_methods({"hf", "specviz:tree", "specviz:tree-7-n3", "specviz:draft-4"}, (4,))
    for bad in ("specviz:nonsense", "specviz:draft-5", "hf:assisted-6"):
        with pytest.raises(ValueError, match="selects no method"):
            bench.check_methods({bad}, (4,))


def trec(method, cls, tokens, seconds, passes, nodes, prompt=0, widths=None, draft=0, decode=4.0):
    """decode: seconds after round 1, which committed 5 of the tokens."""
    return Record(method, "specviz", 4, prompt, cls, 0, tokens, seconds, target_passes=passes, alpha=0.5,
                  draft_seconds=1.0, target_seconds=seconds - 1.5, other_seconds=0.5, nodes_verified=nodes,
                  accepted=tokens - passes, widths=widths, draft_passes=draft, decode_tokens=tokens - 5,
                  decode_seconds=decode)


def test_missing_rates_show_as_gaps_not_zeros(tmp_path):
    """Runs of one round each have no rate after round 1: the tree table's decode ratio is "-", not
    "0.00x"; methods whose baseline did not run get no bar in the HTML plot, not a 0x one."""
    records = [trec("specviz:draft-2", "edit", 3, 1.0, 1, 2, decode=0.0),
               trec("specviz:tree-2", "edit", 3, 1.0, 1, 4, decode=0.0)]
    s = benchreport.summarize(records)
    assert s["specviz:tree-2"]["edit"]["decode_tokens_per_second"] is None
    row = benchreport.tree_table(benchreport.tree_vs_chain(s), s).split("| specviz:tree-2 | edit |")[1]
    assert "| - |" in row.split("\n")[0] and "0.00x" not in row
    benchreport.html_report(s, tmp_path / "r.html", "t")
    html = (tmp_path / "r.html").read_text()
    assert '"y":[null,null]' in html and '"y":[0,0]' not in html


def test_tree_against_the_chain_ratios_and_verdicts_are_exact():
    records = [trec("specviz:draft-4", "edit", 60, 10.0, 20, 80, decode=6.0),
               trec("specviz:draft-4", "chat", 60, 12.0, 30, 120, prompt=1, decode=8.0),
               trec("specviz:tree-4", "edit", 60, 10.5, 15, 150, decode=5.0),
               trec("specviz:tree-4", "chat", 60, 12.0, 28, 280, prompt=1, decode=11.0)]
    s = benchreport.summarize(records)
    t = benchreport.tree_vs_chain(s)["specviz:tree-4"]
    edit, chat, every = t["classes"]["edit"], t["classes"]["chat"], t["classes"]["all"]
    # edit: 4.0 against 3.0 tokens per pass; 60 / 10.5 against 6.0 tok/s
    assert edit["tokens_per_pass"] == pytest.approx(4 / 3) and edit["tokens_per_pass_ok"]
    assert edit["tokens_per_second"] == pytest.approx(10 / 10.5) and edit["tokens_per_second_ok"]
    # with the prompt paid (55 tokens after round 1 in each): 55 / 5 against 55 / 6 s
    assert edit["decode_tokens_per_second"] == pytest.approx(6 / 5)
    assert chat["decode_tokens_per_second"] == pytest.approx(8 / 11)
    assert every["decode_tokens_per_second"] == pytest.approx(14 / 16)  # 110 / 16 against 110 / 14
    assert s["specviz:tree-4"]["edit"]["decode_tokens_per_second"] == pytest.approx(11.0)
    # chat: 60 / 28 against 2.0 tokens per pass = 1.071 < 1.1; same tok/s
    assert chat["tokens_per_pass"] == pytest.approx(30 / 28) and not chat["tokens_per_pass_ok"]
    assert chat["tokens_per_second"] == pytest.approx(1.0) and chat["tokens_per_second_ok"]
    # all: 120 / 43 against 120 / 50 passes; 22 against 22.5 seconds
    assert every["tokens_per_pass"] == pytest.approx(50 / 43)
    assert every["tokens_per_second"] == pytest.approx(22 / 22.5)
    assert (t["chain"], t["depth"], t["nodes"], t["branching"], t["goal_depth"]) \
        == ("specviz:draft-4", 4, None, None, True)
    assert not t["tokens_per_pass_ok"] and t["tokens_per_second_ok"]  # chat fails goal (a)
    row = s["specviz:tree-4"]["edit"]
    assert row["nodes_per_round"] == 10.0 and row["accepted_per_node"] == pytest.approx(45 / 150)
    assert (row["draft_seconds"], row["target_seconds"], row["other_seconds"]) == (1.0, 9.0, 0.5)
    assert s["specviz:draft-4"]["edit"]["nodes_per_round"] == 4.0
    text = benchreport.tree_table(benchreport.tree_vs_chain(s), s)
    assert ("| specviz:tree-4 | edit | 4.00 / 3.00 | 1.33x pass | 5.71 / 6.00 | 0.952x pass | 1.20x "
            "| 10.0 / 4.0 | 0.30 | 1.00 / 9.00 / 0.500 |") in text
    assert "| specviz:tree-4 | chat | 2.14 / 2.00 | 1.07x FAIL | 5.00 / 5.00 | 1.00x pass |" in text
    assert "| specviz:tree-4 | every class | | FAIL | | pass | | | | |" in text
    rows = benchreport.per_prompt(records)
    assert rows["specviz:tree-4"][1] == {"class": "chat", "runs": 1, "tokens": 60, "seconds": 12.0,
                                         "tokens_per_second": 5.0, "tokens_per_pass": 60 / 28,
                                         "nodes_per_round": 10.0, "draft_seconds": 1.0,
                                         "target_seconds": 10.5, "other_seconds": 0.5}
    assert "| specviz:tree-4 | #1 | chat | 2.14 | 5.00 | 10.0 | 1.00 / 10.50 / 0.500 |" in \
        benchreport.per_prompt_table(rows, ["specviz:tree-4"])
    # no chain at the depth: no ratios
    assert benchreport.tree_vs_chain(benchreport.summarize(records[2:])) == {}


# eager: C_D 2 ms, C_T 10 / 14 / 18 ms at widths 1 / 3 / 5 (past 5: +2 ms a token)
PROFILE = {"format": "specviz-costs", "version": 1, "name": "hand-made", "hardware": {}, "packages": {},
           "paths": {"eager": {"draft_ms": 2.0, "target_ms": {"1": 10.0, "3": 14.0, "5": 18.0}}}}


def test_tree_projection_verifies_one_plus_nodes_a_round():
    # a tree run: 2 rounds of 8 nodes (width 9: 18 + 4 * 2 = 26 ms), 6 batched draft passes;
    # the chain at depth 4: 3 rounds of width 5 (18 ms), 12 draft passes; 12 tokens each
    records = [trec("specviz:draft-4", "edit", 12, 1.0, 3, 12, widths={5: 3}, draft=12),
               trec("specviz:tree-4", "edit", 12, 1.0, 2, 16, widths={9: 2}, draft=6)]
    out = benchreport.projected(records, profiles.load(PROFILE))
    assert math.isclose(out["specviz:tree-4"]["eager"]["seconds"], 6 * 0.002 + 2 * 0.026)
    assert math.isclose(out["specviz:draft-4"]["eager"]["seconds"], 12 * 0.002 + 3 * 0.018)
    assert math.isclose(out["specviz:tree-4"]["eager"]["vs_chain"], 0.078 / 0.064)
    assert "vs_chain" not in out["specviz:draft-4"]["eager"]
    assert "187.5 tok/s, -, 1.22x chain" in benchreport.projected_table(out, profiles.load(PROFILE))


def test_plainhead_projection_is_over_its_own_target_alone():
    """The pass counts project onto the seconds of the summary's hand case: none 200 passes of
    width 1 (2 s), none-plainhead 400 (4 s), draft-4-plainhead 100 rounds of width 5 and 100
    draft passes (1.8 + 0.2 s); 20 tokens each: (20 / 2) / (20 / 4) = 2.00x, not 1.00x."""
    def alone(method, family, passes):
        return Record(method, family, None, 0, "code", 0, 20, 1.0, widths={1: passes})
    records = [alone("specviz:none", "specviz", 200), alone("specviz:none-plainhead", bench.PLAIN_HEAD, 400),
               Record("specviz:draft-4-plainhead", bench.PLAIN_HEAD, 4, 0, "code", 0, 20, 1.0,
                      widths={5: 100}, draft_passes=100)]
    out = benchreport.projected(records, profiles.load(PROFILE))
    assert math.isclose(out["specviz:draft-4-plainhead"]["eager"]["seconds"], 2.0)
    assert math.isclose(out["specviz:none-plainhead"]["eager"]["seconds"], 4.0)
    assert math.isclose(out["specviz:draft-4-plainhead"]["eager"]["speedup"], 2.0)
    assert "10.0 tok/s, 2.00x" in benchreport.projected_table(out, profiles.load(PROFILE))


def test_tree_bench_on_tiny_models_reports_the_goal_ratios(model_dirs, tmp_path, capsys):
    from specviz.cli import main

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "def fibonacci(n):"},
                                   {"class": "text", "prompt": "The dog. The dog."}]))
    out, md = tmp_path / "b.json", tmp_path / "b.md"
    path = profiles.save(profiles.load(PROFILE), tmp_path / "gpu.json")
    rc = main(["bench", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--prompts", str(prompts), "--ks", "3",
               "--methods", "specviz:none,specviz:tree-3,specviz:tree-3-n6-b2", "--max-new-tokens", "12",
               "--json", str(out), "--markdown", str(md), "--profile", str(path)])
    assert rc == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert {r["method"] for r in data["records"]} == {"specviz:none", "specviz:draft-3", "specviz:tree-3",
                                                     "specviz:tree-3-n6-b2"}
    assert all(r["matches_target"] is not False for r in data["records"])  # greedy trees write its text
    assert all(r["matches_target"] for r in data["records"] if "tree" in r["method"])
    s, trees = data["summary"], data["tree_vs_chain"]
    assert set(trees) == {"specviz:tree-3", "specviz:tree-3-n6-b2"}
    assert data["tree_goals"] == benchreport.TREE_GOALS
    for name, t in trees.items():
        assert t["chain"] == "specviz:draft-3" and not t["goal_depth"]
        assert set(t["classes"]) == {"code", "text", "all"}
        for cls, r in t["classes"].items():
            assert r["tokens_per_pass"] == pytest.approx(s[name][cls]["tokens_per_pass"]
                                                         / s["specviz:draft-3"][cls]["tokens_per_pass"])
            assert r["tokens_per_second"] == pytest.approx(s[name][cls]["tokens_per_second"]
                                                           / s["specviz:draft-3"][cls]["tokens_per_second"])
            assert r["tokens_per_pass_ok"] == (r["tokens_per_pass"] >= 1.1)
    for r in data["records"]:  # every round verifies 1 + its nodes; a fixed budget caps them
        assert sum(r["widths"].values()) == r["target_passes"]
        assert sum((int(w) - 1) * n for w, n in r["widths"].items()) == r["nodes_verified"]
        if r["method"] == "specviz:tree-3-n6-b2":
            assert max(int(w) for w in r["widths"]) <= 7
    assert data["per_prompt"]["specviz:tree-3"]["0"]["nodes_per_round"] > 0
    assert "vs_chain" in data["projected"]["specviz:tree-3"]["eager"]
    for text in (printed, md.read_text()):
        assert "Token trees against the chain at the same depth" in text and "Per prompt" in text
        assert "| specviz:tree-3-n6-b2 | every class" in text
        assert "| specviz:draft-3 | #0 | code |" in text  # the chain's rows beside its trees'


def test_costs_verify_slope_is_the_least_squares_fit_of_pass_times():
    # exactly linear: 10 ms + 0.5 ms a verified token -> slope 0.05
    fit = costs.verify_fit({1: 10.0, 2: 10.5, 3: 11.0, 5: 12.0, 9: 14.0})
    assert fit["pass_ms"] == pytest.approx(10.0) and fit["per_token_ms"] == pytest.approx(0.5)
    assert fit["slope"] == pytest.approx(0.05)
    # by hand: n = 0, 1, 3 (mean 4/3), T = 10, 12, 13 (mean 35/3); cov = (4/3*5/3 - 1/3*1/3 + 5/3*4/3) / 3
    # = 13/9, var = (16/9 + 1/9 + 25/9) / 3 = 14/9: b = 13/14, a = 35/3 - 13/14 * 4/3 = 73/7
    fit = costs.verify_fit({"1": 10.0, "2": 12.0, "4": 13.0})  # JSON's string keys
    assert fit["per_token_ms"] == pytest.approx(13 / 14) and fit["pass_ms"] == pytest.approx(73 / 7)
    assert fit["slope"] == pytest.approx(13 / 146)
    # falling times: b is held at 0; one width alone: no slope to fit
    assert costs.verify_fit({1: 10.0, 3: 9.0}) == {"pass_ms": 9.5, "per_token_ms": 0.0, "slope": 0.0}
    with pytest.raises(ValueError, match="two widths"):
        costs.verify_fit({1: 10.0})


def test_costs_prints_the_slope_against_the_lines_intercept_and_the_measured_pass(monkeypatch, capsys):
    """The eager CPU pass times of docs/benchmarks.md: the least-squares line over n = 0, 1, 2, 4,
    8, 16 is T(n) = 291.6 + 167.53 n ms, so a token is 0.5745 of the line's intercept and
    167.53 / 326 = 0.514 of the measured 1-token pass (the label said the first was the second)."""
    from types import SimpleNamespace

    from specviz import cli

    target_ms = {1: 326.0, 2: 467.0, 3: 630.0, 5: 920.0, 9: 1605.0, 17: 2995.0}
    eager = SimpleNamespace(draft=None, fast="eager", target=None)  # the pair: its runs eager, as here
    monkeypatch.setattr(cli, "load_from_args", lambda args: eager)
    monkeypatch.setattr(costs, "measure", lambda pair, repeats, formats: {
        "target_ms": dict(target_ms), "draft_ms": {"none": 100.0}})
    args = SimpleNamespace(repeats=1, draft_quant="none", json=False, profile=False)
    assert costs.cmd_costs(args) == 0
    out = capsys.readouterr().out
    n = [w - 1 for w in target_ms]
    mean_n, mean_t = sum(n) / 6, sum(target_ms.values()) / 6
    ms = list(target_ms.values())
    cov = sum((x - mean_n) * (t - mean_t) for x, t in zip(n, ms, strict=True))
    b = cov / sum((x - mean_n) ** 2 for x in n)
    a = mean_t - b * mean_n
    assert round(a, 1) == 291.6 and round(b, 2) == 167.53
    assert f"costs {b / a:.4f} of the line's 1-token pass" in out and "0.5745" in out
    assert "n = drafted tokens = width - 1" in out and "or 0.514 of the measured 1-token pass" in out
    assert "2: 467 ms (1.43x)" in out and "(9.19x)" in out  # each width over the 1-token pass
    # float32 on oneDNN (the next test's passes): 620 ms a drafted pass at n = 0, 365 alone, then
    # 20 ms a drafted token: 620 / 365 = 1.699 of a 1-token pass, 20 / 365 = 0.0548 a token
    monkeypatch.setattr(costs, "measure", lambda pair, repeats, formats: {
        "target_ms": {1: 365.0, 2: 640.0, 3: 660.0, 5: 700.0, 9: 780.0}, "draft_ms": {}})
    assert costs.cmd_costs(args) == 0
    out = capsys.readouterr().out
    assert "a drafted pass costs 1.699 of a 1-token pass plus 0.0548 a drafted token" in out


def test_a_pass_cost_is_the_median_of_the_timed_passes_after_the_warm_up(monkeypatch):
    """pass_seconds reads the cached ids once, warms up with one pass, then times `repeats`: a slow
    first pass (100 ms here, on a clock the test moves) is not in the median."""
    clock = FakeTime()
    lm = TimedPasses(clock, [0.001, 0.1, 0.001])  # reading the ids, the warm-up, the timed pass
    monkeypatch.setattr(costs, "engine_lm", lambda *a: lm)
    monkeypatch.setattr(costs, "time", clock)
    assert costs.pass_seconds(None, 10, [1, 2], 3, repeats=1) == pytest.approx(0.001)
    assert [len(ids) for ids, _ in lm.fed] == [2, 5, 5]  # the ids, then the warm-up and one timed pass


def test_costs_splits_the_step_to_a_drafted_pass_from_each_drafted_token():
    # float32 on oneDNN here: 365 ms alone, then 620 ms + 20 ms a drafted token (n = 1, 2, 4, 8)
    fit = costs.verify_fit({1: 365.0, 2: 640.0, 3: 660.0, 5: 700.0, 9: 780.0})
    assert fit["step"] == pytest.approx(255 / 365) and fit["drafted_slope"] == pytest.approx(20 / 365)
    # the straight line through all five prices a token at 39 ms: by hand, n = 0, 1, 2, 4, 8
    # (mean 3), T mean 629; cov = (3*264 - 2*11 - 1*31 + 1*71 + 5*151) / 5 = 313, var = 40/5 = 8
    assert fit["per_token_ms"] == pytest.approx(313 / 8)
    # a flat machine: no step; widths 1 and 2 only, or no one-token pass: no pieces
    assert costs.verify_fit({1: 10.0, 2: 10.5, 3: 11.0})["step"] == pytest.approx(0.0)
    assert "step" not in costs.verify_fit({1: 10.0, 2: 12.0})
    assert "step" not in costs.verify_fit({2: 10.0, 3: 12.0, 5: 13.0})


def test_the_n_gram_replays_read_transformers_then_specviz_then_the_plain_heads_text():
    from specviz.bench import PLAIN_HEAD, reference_texts

    # inserted as the methods run: specviz:none, then the plain head, then (for prompt 1) hf:target
    reference = {("specviz", 0): [1], (PLAIN_HEAD, 0): [2], (PLAIN_HEAD, 1): [3],
                 ("specviz", 1): [4], ("transformers", 1): [5], (PLAIN_HEAD, 2): [6]}
    assert reference_texts(reference) == {0: [1], 1: [5], 2: [6]}


def test_the_plainhead_target_alone_runs_before_its_draft_in_every_process():
    """The two were added from a set: under some hash seeds the draft ran first, found no
    reference output yet, and was reported "not compared" on every prompt of repeat 0."""
    names = {"specviz:draft-4-plainhead", "specviz:none-plainhead"}
    for _ in range(3):
        order = [m for m in bench.methods((4,), set(names), has_draft=True) if "plainhead" in m]
        assert order == ["specviz:none-plainhead", "specviz:draft-4-plainhead"]


def test_shares_and_rates_near_all_or_none_never_print_as_all_or_none():
    """α = 249/250 printed "1.00" (nothing refused), a 99.6 % target share "100%" and a 0.2 % draft
    share "0%"; a tree 0.4 % slower than its chain "1.00x chain"; 0.996 accepted per node "1.00"."""
    spec = dict(target_passes=250, alpha=249 / 250, draft_seconds=0.2, target_seconds=99.6, other_seconds=0.2,
                accepted=249, rejections=1)
    s = benchreport.summarize([rec("specviz:draft-1", "specviz", "code", 500, 100.0, **spec)])
    row = benchreport.markdown(s, META).split("| specviz:draft-1 | 2.00 |")[1].split("\n")[0]
    assert row.startswith(" 0.996 | - | 0.2% / 99.6% / 0.2% |"), row
    records = [trec("specviz:draft-4", "edit", 12, 1.0, 3, 12, widths={5: 3}, draft=12),
               trec("specviz:tree-4", "edit", 12, 1.0, 2, 16, widths={9: 2}, draft=6)]
    out = benchreport.projected(records, profiles.load(PROFILE))
    out["specviz:tree-4"]["eager"]["vs_chain"] = 0.996
    assert "0.996x chain" in benchreport.projected_table(out, profiles.load(PROFILE))
    s = benchreport.summarize(records)
    s["specviz:tree-4"]["edit"]["accepted_per_node"] = 0.996
    row = benchreport.tree_table(benchreport.tree_vs_chain(s), s).split("| specviz:tree-4 | edit |")[1]
    assert "| 0.996 |" in row.split("\n")[0] and "| 1.00 |" not in row.split("\n")[0]


def test_a_compiled_path_pads_a_chain_to_its_k_and_a_tree_to_a_power_of_two():
    """C_D 1 ms; C_T 1 ms at width 1, 0.125 ms more a token to 2 ms at 9. The chain (k = 4) verifies
    3, 3, 5, 1 tokens, fed as 5, 5, 5, 1 (1.5 ms each, then 1) with 6 draft passes: 11.5 ms; the tree's
    2 rounds of 6 nodes (width 7) feed 1 + 8 (2 ms each) with 4 draft passes: 8 ms. A path without a
    draft cost, listed first, leaves the draft methods projected on the later ones."""
    import copy

    raw = copy.deepcopy(PROFILE)
    raw["paths"] = {"nodraft": {"draft_ms": None, "target_ms": {"1": 1.0}},
                    "fast": {"cache": "static", "compiled": True, "draft_ms": 1.0,
                             "target_ms": {"1": 1.0, "9": 2.0, "17": 4.0}}}
    records = [Record("specviz:draft-4", "specviz", 4, 0, "edit", 0, 12, 1.0, draft_passes=6,
                      widths={3: 2, 5: 1, 1: 1}),
               Record("specviz:tree-4", "specviz", 4, 0, "edit", 0, 12, 1.0, draft_passes=4, widths={7: 2})]
    out = benchreport.projected(records, profiles.load(raw))
    assert set(out["specviz:draft-4"]) == set(out["specviz:tree-4"]) == {"fast"}
    assert math.isclose(out["specviz:draft-4"]["fast"]["seconds"], 0.0115)
    assert math.isclose(out["specviz:tree-4"]["fast"]["seconds"], 0.008)
    assert math.isclose(out["specviz:tree-4"]["fast"]["vs_chain"], 11.5 / 8)


def test_only_the_target_alones_transformers_passes_have_known_widths(pair):
    """Prompt lookup's verify widths are not observed: given the target alone's ({1: passes}), its
    run was projected as if each pass verified one token."""
    ids = pair.encode("The dog. The dog.")
    tokens, alone = bench.hf_method("target", 0)(pair, ids, 6)
    assert alone["widths"] == {1: alone["target_passes"]} and alone["target_passes"] == len(tokens)
    assert bench.hf_method("lookup", 8)(pair, ids, 6)[1]["widths"] is None


def test_each_method_runs_on_its_pair_and_only_a_target_alone_sets_the_reference(pair, monkeypatch):
    """transformers runs the draft as loaded, but hf:assisted-4-qdraft specviz's quantized copy; the
    plain head's methods drop the float32 refinement; a family whose target alone did not run is
    compared with nothing (its first method is no reference)."""
    import copy
    from dataclasses import replace

    spec_pair = replace(pair, draft=copy.deepcopy(pair.draft))
    ran, real = [], bench.generate

    def spy(p, ids, **kw):
        ran.append((kw["proposer"], kw["max_new_tokens"], p.draft is spec_pair.draft, p.refine))
        return real(p, ids, **kw)

    def fake_hf(kind, k):
        def run(on, ids, n):
            ran.append((f"hf:{kind}", n, on.draft is spec_pair.draft, on.refine))
            return [1] * n, dict(target_passes=n, draft_passes=0, widths=None)
        return run

    monkeypatch.setattr(bench, "generate", spy)
    monkeypatch.setattr(bench, "hf_method", fake_hf)
    names = {"hf:assisted-4", "hf:assisted-4-qdraft", "specviz:ngram-8", "specviz:none-plainhead",
             "specviz:draft-4-plainhead"}
    records, _, _ = bench.run_bench(pair, [{"class": "code", "prompt": "def f(n):"}], ks=(4,),
                                    max_new_tokens=3, names=names, log=[].append, spec_pair=spec_pair)
    assert [r for r in ran if r[1] == 3] == [("ngram", 3, True, True), ("hf:assisted", 3, False, True),
                                             ("hf:assisted", 3, True, True), ("none", 3, True, False),
                                             ("draft", 3, True, False)]
    assert {r.method: r.matches_target for r in records} == {
        "specviz:ngram-8": None, "hf:assisted-4": None, "hf:assisted-4-qdraft": None,
        "specviz:none-plainhead": None, "specviz:draft-4-plainhead": True}


def test_same_text_passes_add_up_each_classs_prompts(monkeypatch):
    """Two prompts of one class: their passes are summed (one token a pass here: 3 + 4), not the last
    prompt's alone; the table's "all" column adds the classes."""
    from types import SimpleNamespace

    monkeypatch.setattr(bench, "lookup_rules", lambda pair, ids, n: {"none": lambda ids, budget: []})
    pair = SimpleNamespace(encode=lambda text, chat: [ord(c) for c in text],
                           tokenizer=SimpleNamespace(chat_template=None))
    prompts = [{"class": c, "prompt": p} for c, p in (("code", "a"), ("code", "b"), ("chat", "c"))]
    same = bench.same_text_passes(pair, prompts, {0: [1, 2, 3], 1: [4, 5, 6, 7], 2: [8]}, 8)
    assert same == {"code": {"none": 7}, "chat": {"none": 1}}
    assert "| none | 1 | 7 | 8 |" in benchreport.same_text_table(same)


def test_the_reference_run_is_not_counted_as_a_match():
    """Two repeats of the target alone: the first sets the reference (matches_target None), the
    second matches it: 1 of 1 compared, not 2 of 1."""
    records = [Record("specviz:none", "specviz", None, 0, "code", repeat, 10, 1.0, matches_target=m)
               for repeat, m in ((0, None), (1, True))]
    s = benchreport.summarize(records)
    assert (s["specviz:none"]["all"]["matches_target"], s["specviz:none"]["all"]["compared"]) == (1, 1)
    assert "| 1/1 |" in benchreport.markdown(s, META)


def test_trees_ngrams_and_hybrids_are_measured_against_their_own_transformers_counterparts():
    """hf:target 3 tok/s; assisted-4 6 (2x), assisted-4-qdraft 12 (4x, on the quantized draft: not what
    a transformers user runs), lookup-8 5 (5/3x). specviz:none 3 tok/s; tree-4 7.5 (2.5x) against
    assisted at its depth: 1.25; ngram-8 6 (2x) against lookup alone: 1.2; hybrid-8 15 (5x) against
    the better of assisted-4 and lookup, not the qdraft: 2.5."""
    runs = (("hf:target", 20.0), ("hf:assisted-4", 10.0), ("hf:assisted-4-qdraft", 5.0),
            ("hf:lookup-8", 12.0), ("specviz:none", 20.0), ("specviz:tree-4", 8.0),
            ("specviz:ngram-8", 10.0), ("specviz:hybrid-8", 4.0))
    records = [rec(m, "transformers" if m.startswith("hf:") else "specviz", "c", 60, seconds)
               for m, seconds in runs]
    s = benchreport.summarize(records)
    vs = {m: s[m]["c"].get("vs_transformers")
          for m in ("specviz:tree-4", "specviz:ngram-8", "specviz:hybrid-8")}
    assert vs == pytest.approx({"specviz:tree-4": 1.25, "specviz:ngram-8": 1.2, "specviz:hybrid-8": 2.5})


def test_a_tree_cut_short_is_compared_with_its_chain_over_the_runs_both_made():
    """The tree failed after prompt 0 (bench.run_bench): the chain made 60 tokens in 20 passes and
    10 s there, and 60 in 60 passes and 30 s on prompt 1. Over prompt 0 the tree's 60 in 15 passes
    and 10 s is 4 / 3 = 1.33x the chain's tokens per pass and 1.0x its tok/s; against the chain's
    rates over both prompts it would read 4 / 1.5 = 2.67x and 6 / 3 = 2.0x. The chat class, which
    the tree never reached, fails the verdicts and the table says which runs it compared."""
    records = [trec("specviz:draft-4", "edit", 60, 10.0, 20, 80),
               trec("specviz:draft-4", "edit", 60, 30.0, 60, 240, prompt=1),
               trec("specviz:draft-4", "chat", 60, 10.0, 20, 80, prompt=2),
               trec("specviz:tree-4", "edit", 60, 10.0, 15, 150)]
    s = benchreport.summarize(records)
    t = benchreport.tree_vs_chain(s, records)["specviz:tree-4"]
    edit = t["classes"]["edit"]
    assert edit["tokens_per_pass"] == pytest.approx(4 / 3) and edit["tokens_per_second"] == pytest.approx(1.0)
    assert (edit["chain_tokens_per_pass"], edit["chain_tokens_per_second"]) == (3.0, 6.0)
    assert t["classes"]["all"]["tokens_per_pass"] == pytest.approx(4 / 3)
    assert "chat" not in t["classes"] and t["shared_runs"] == 1
    assert not t["tokens_per_pass_ok"] and not t["tokens_per_second_ok"]
    text = benchreport.tree_table(benchreport.tree_vs_chain(s, records), s)
    assert "| specviz:tree-4 | edit | 4.00 / 3.00 | 1.33x pass | 6.00 / 6.00 | 1.00x pass |" in text
    assert "tok/s and decode ratio are over the 1 run both made; nodes, accepted/node" in text
    # where both made the same runs, the figures are the summary's and no note is added
    # the chain cut short instead (it never reached chat, where the tree ran): no pass either
    tree_chat = trec("specviz:tree-4", "chat", 60, 5.0, 10, 100, prompt=2)
    cut = [records[0], records[3], tree_chat]
    t = benchreport.tree_vs_chain(benchreport.summarize(cut), cut)["specviz:tree-4"]
    assert t["classes"]["edit"]["tokens_per_pass_ok"] and "chat" not in t["classes"]
    assert not t["tokens_per_pass_ok"] and not t["tokens_per_second_ok"]
    both = records[:1] + records[3:]
    same = benchreport.tree_vs_chain(benchreport.summarize(both), both)["specviz:tree-4"]
    assert same["shared_runs"] is None and same["classes"]["edit"]["tokens_per_pass"] == pytest.approx(4 / 3)


def test_a_tree_exactly_at_a_goal_passes_it():
    """The goals read ">= 1.1x" and ">= 0.95x": a tree at exactly 1.1x the chain's tokens per pass
    (19 tokens in 19 passes against 20 in 22) and 0.95x its tok/s (19 against 20 in 1 s) meets both."""
    records = [trec("specviz:tree-4", "edit", 19, 1.0, 19, 19),
               trec("specviz:draft-4", "edit", 20, 1.0, 22, 22)]
    t = benchreport.tree_vs_chain(benchreport.summarize(records))["specviz:tree-4"]
    edit = t["classes"]["edit"]
    assert edit["tokens_per_pass"] == 1.1 and edit["tokens_per_second"] == 0.95
    assert t["tokens_per_pass_ok"] and t["tokens_per_second_ok"]


def test_the_verdicts_read_the_prompt_classes_not_their_pooled_row():
    """Tree 10 tokens in 5 passes (a), 90 in 90 (b); chain 90 in 50 (a), 10 in 12 (b): 1.11x and 1.2x
    the chain's tokens per pass in each class, so the goal holds, though the pooled row is 100 / 95
    against 100 / 62 (0.653x)."""
    records = [trec("specviz:tree-4", "a", 10, 1.0, 5, 5),
               trec("specviz:tree-4", "b", 90, 1.0, 90, 90, prompt=1),
               trec("specviz:draft-4", "a", 90, 1.0, 50, 50),
               trec("specviz:draft-4", "b", 10, 1.0, 12, 12, prompt=1)]
    t = benchreport.tree_vs_chain(benchreport.summarize(records))["specviz:tree-4"]
    assert [round(t["classes"][c]["tokens_per_pass"], 3) for c in ("a", "b", "all")] == [1.111, 1.2, 0.653]
    assert t["tokens_per_pass_ok"]


def test_a_chain_without_a_rate_gives_no_ratios_and_no_pass():
    """A chain row of 0 tok/s (no time measured): no class is compared, and no goal is met by default
    (no division by zero, no vacuous pass)."""
    s = {"specviz:tree-4": {"c": {"tokens_per_pass": 2.0, "tokens_per_second": 5.0}},
         "specviz:draft-4": {"c": {"tokens_per_pass": 1.5, "tokens_per_second": 0.0}}}
    t = benchreport.tree_vs_chain(s)["specviz:tree-4"]
    assert t["classes"] == {} and not t["tokens_per_pass_ok"] and not t["tokens_per_second_ok"]


def test_the_markdown_file_holds_the_outputs_that_differ(tmp_path, monkeypatch, capsys):
    """The printed list of outputs that parted from the target alone's goes to --markdown too."""
    from types import SimpleNamespace

    from specviz import cli

    pair = SimpleNamespace(draft=None, target_name="t", draft_name=None, dtype="float32", device="cpu",
                           tokenizer=SimpleNamespace(chat_template=None))
    monkeypatch.setattr(cli, "load_from_args", lambda args: pair)
    records = [rec("specviz:none", "specviz", "code", 4, 1.0),
               rec("specviz:ngram-8", "specviz", "code", 4, 1.0, matches_target=False, first_difference=2,
                   difference="near-tie")]
    monkeypatch.setattr(bench, "run_bench", lambda *a, **kw: (records, {}, []))
    prompts, md = tmp_path / "p.json", tmp_path / "b.md"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "x"}]))
    assert cli.main(["bench", "--target", "T", "--prompts", str(prompts), "--methods",
                     "specviz:none,specviz:ngram-8", "--markdown", str(md)]) == 0
    line = "- specviz:ngram-8, prompt #0 (code), repeat 0: from output token 3: near-tie"
    assert line in capsys.readouterr().out and line in md.read_text()


def test_both_heads_target_alone_is_measured_against_transformers_target_alone():
    """hf:target 20 tokens in 5 s (4 tok/s); specviz:none in 2 s (10: 2.5x), none-plainhead in 4 s (5:
    1.25x, the plain head has a family of its own but the same counterpart), draft-4-plainhead in 2 s
    (2x its target alone) against assisted-4 in 4 s (1.25x): 1.6."""
    runs = (("hf:target", 5.0), ("hf:assisted-4", 4.0), ("specviz:none", 2.0),
            ("specviz:none-plainhead", 4.0), ("specviz:draft-4-plainhead", 2.0))
    s = benchreport.summarize([rec(m, "transformers" if m.startswith("hf:") else "specviz", "c", 20, t)
                               for m, t in runs])
    assert {m: s[m]["c"]["vs_transformers"] for m, _ in runs[2:]} == pytest.approx(
        {"specviz:none": 2.5, "specviz:none-plainhead": 1.25, "specviz:draft-4-plainhead": 1.6})


def test_the_report_header_names_the_drafts_that_ran_and_says_so_when_none_did():
    s = benchreport.summarize([rec("specviz:none", "specviz", "edit", 16, 1.0, target_passes=16)])
    alone = benchreport.markdown(s, {**META, "draft": None, "specviz_draft": None})
    assert alone.startswith("t with no draft model, bf16 on cpu") and "None" not in alone.split("\n")[0][:60]
    same = benchreport.markdown(s, {**META, "specviz_draft": "d"})
    assert same.startswith("t with draft d, bf16")
    other = benchreport.markdown(s, {**META, "specviz_draft": "d4"})
    assert other.startswith("t with draft d (specviz: d4), bf16")


def test_the_printed_tables_columns_stay_under_their_heads_for_a_long_method_name():
    """The names' column was 22 characters: specviz:draft-4-plainhead (25) pushed its row's cells 3
    characters right of their heads."""
    spec = dict(target_passes=10, alpha=0.5, draft_seconds=1.0, target_seconds=2.0, other_seconds=0.1)
    s = benchreport.summarize([rec("specviz:none", "specviz", "edit", 60, 20.0, **spec),
                               rec("specviz:draft-4-plainhead", "specviz", "edit", 60, 10.0, **spec)])
    head, _, *rows = benchreport.table(s).splitlines()
    assert len({len(line) for line in [head, *rows]}) == 1  # every row as wide as the head
    assert rows[1].startswith("specviz:draft-4-plainhead ")


def test_where_specviz_compiles_each_method_runs_untimed_before_its_timed_runs(pair, compiled_pair,
                                                                               monkeypatch):
    """A compiled or captured step's first use of a width compiles or captures it (0.1-0.5 s a
    capture on the H200): the warm-up covered the k = 4 chain and a tree, so draft-1, 2, 3, 6, 8,
    the n-gram, hybrid and adaptive methods paid it in their first timed run. Where specviz's
    steps compile, each method now runs bench.WARM_TOKENS untimed first; where they run eager (the
    CPU's default) nothing more runs."""
    calls, real = [], bench.methods

    def counted(name, run):
        return lambda on, ids, n: calls.append((name, n)) or run(on, ids, n)

    def spied(*a, **kw):
        return {name: (family, k, counted(name, run)) for name, (family, k, run) in real(*a, **kw).items()}

    monkeypatch.setattr(bench, "methods", spied)
    names = {"specviz:none", "specviz:draft-2"}
    for on, warmed in ((pair, 0), (compiled_pair, 2)):
        calls.clear()
        bench.run_bench(on, [{"class": "code", "prompt": "def f(n):"}], ks=(2,), max_new_tokens=4,
                        names=names, log=[].append)
        assert [n for _, n in calls] == [bench.WARM_TOKENS] * warmed + [4, 4]
        assert {name for name, _ in calls} == names


def test_costs_say_where_the_engine_runs_other_passes_than_they_time(pair, compiled_pair):
    """costs times eager passes on a dynamic cache, the CPU's default path; where the pair's runs
    compile their steps (CUDA's default) those are not the engine's passes, and costs said nothing."""
    assert costs.fast_note(pair) is None
    assert costs.fast_note(compiled_pair) == (
        "these are eager passes (a dynamic cache); on cpu the engine runs compiled steps on a static "
        "cache: `python -m specviz gpucheck` times both")


def test_transformers_assisted_generation_runs_on_a_pair_whose_vocabularies_differ(model_dirs, tmp_path):
    """The qwen2.5-7b preset's target has 152,064 rows and its 0.5B draft 151,936: transformers
    refuses assisted generation on such a pair unless given both tokenizers ("different
    tokenizers"), and the bench failed there, after four methods had run, saving nothing. It now
    passes them, and transformers runs its universal assisted decoding: greedy, the target's own."""
    from specviz.cli import main

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "def fibonacci(n):"}]))
    out = tmp_path / "b.json"
    rc = main(["bench", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["padded-draft"]),
               "--dtype", "float32", "--device", "cpu", "--prompts", str(prompts), "--ks", "2",
               "--max-new-tokens", "8", "--methods", "hf:target,hf:assisted-2", "--json", str(out),
               "--markdown", str(tmp_path / "b.md")])
    assert rc == 0
    data = json.loads(out.read_text())
    by = {r["method"]: r for r in data["records"]}
    assert by["hf:assisted-2"]["matches_target"] is True and by["hf:assisted-2"]["tokens"] == 8
    said = "transformers' assisted rows ran its universal assisted decoding"  # another path, said so
    assert data["meta"]["hf_assisted"].startswith(said) and said in (tmp_path / "b.md").read_text()


def test_specviz_target_alone_is_compared_with_transformers_and_a_difference_explained(pair, monkeypatch):
    """Each family was compared with its own target alone only, so 'greedy = target alone' never
    checked specviz's greedy output against transformers' generate (a published run had 54 tokens
    against 50 on one prompt, unreported). Where they part, the margins say whether a near-tie."""
    import torch

    import specviz
    from specviz.compare import top2_at

    ids = pair.encode("def f")
    stats = specviz.RunStats.of(specviz.generate(pair, ids, proposer="none", max_new_tokens=6))
    (a, _), (b, _) = top2_at(stats, 3)
    hf = stats.tokens[:3] + [b] + stats.tokens[4:]  # transformers' runner-up at token 4, say
    why = bench.explain_alone(stats, hf, ids, 3, pair)
    with torch.no_grad():  # by hand: the target's margin there, over the context both share
        top = pair.target(torch.tensor([ids + hf[:3]])).logits[0, -1].topk(2).values.tolist()
    ran = top2_at(stats, 3)
    assert why == (f"against transformers' target alone: unexplained: please report (top-2 margins "
                   f"{ran[0][1] - ran[1][1]:.3g} / {top[0] - top[1]:.3g}; near-tie bound "
                   f"{8 * 2.0 ** (math.floor(math.log2(max(abs(ran[0][1]), abs(top[0])))) - 23):.3g})")
    real_hf = bench.hf_method

    def altered(kind, k):  # transformers' target alone writing b at token 4
        run = real_hf(kind, k)
        return lambda on, ids_, n: (lambda out: (out[0][:3] + [b] + out[0][4:], out[1]))(run(on, ids_, n))

    monkeypatch.setattr(bench, "hf_method", altered)
    records, _, _ = bench.run_bench(pair, [{"class": "code", "prompt": "def f"}], ks=(2,), max_new_tokens=6,
                                 names={"hf:target", "specviz:none"}, log=lambda line: None, repeats=2)
    by = {(r.method, r.repeat): r for r in records}
    assert [by["hf:target", i].matches_target for i in (0, 1)] == [None, True]  # its repeat 0
    for i in (0, 1):  # every repeat against transformers' (not its own repeat 0, which it matches)
        assert (by["specviz:none", i].matches_target, by["specviz:none", i].first_difference) == (False, 3)
        assert by["specviz:none", i].difference.startswith("against transformers' target alone: unexplained")


def test_a_method_that_fails_is_said_and_left_out_and_the_others_are_saved(pair, monkeypatch, tmp_path,
                                                                           capsys):
    """One method's error (a pair transformers' assisted decoding cannot take, memory) ended the
    bench with nothing saved, hours in. It is now said, with where it happened, that method
    leaves the runs after it, the others go on, and the file holds them and the failure; the
    exit status is 1. A Ctrl-C keeps the runs before it (status 130)."""
    from specviz import cli

    real_hf = bench.hf_method

    def breaking(kind, k):  # transformers' assisted runs fail on the second prompt
        run = real_hf(kind, k)
        seen = []

        def runner(on, ids, n):
            seen.append(ids)
            if kind == "assisted" and len(seen) == 2:
                raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")
            return run(on, ids, n)
        return runner

    monkeypatch.setattr(bench, "hf_method", breaking)
    monkeypatch.setattr(cli, "load_from_args", lambda args: pair)
    prompts, out = tmp_path / "p.json", tmp_path / "b.json"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "def f(n):"},
                                   {"class": "chat", "prompt": "Hi"}]))
    argv = ["bench", "--target", "T", "--draft", "D", "--prompts", str(prompts), "--methods",
            "hf:target,hf:assisted-2,specviz:none", "--max-new-tokens", "4", "--repeats", "2",
            "--json", str(out), "--markdown", str(tmp_path / "b.md")]
    assert cli.main(argv) == 1
    saved = json.loads(out.read_text())
    ran = [(r["method"], r["repeat"], r["prompt"]) for r in saved["records"]]
    assert ran == [("hf:target", 0, 0), ("specviz:none", 0, 0), ("hf:assisted-2", 0, 0),
                   ("hf:target", 0, 1), ("specviz:none", 0, 1),
                   ("hf:target", 1, 0), ("specviz:none", 1, 0), ("hf:target", 1, 1), ("specviz:none", 1, 1)]
    why = ("hf:assisted-2 failed on prompt #1 (chat, repeat 0): RuntimeError: CUDA out of memory.; "
           "it was left out of the runs after that")
    assert saved["meta"]["stopped"] == [why]
    runs = {m: rows["all"]["runs"] for m, rows in saved["summary"].items()}
    assert runs == {"hf:target": 4, "specviz:none": 4, "hf:assisted-2": 1}
    err = capsys.readouterr().err
    assert f"The bench was cut short:\n- {why}." in err
    # its speedup over the one prompt it ran: not its code run's rate over the target's on both
    by = {(r["method"], r["repeat"], r["prompt"]): r for r in saved["records"]}
    rate = lambda r: r["tokens"] / r["seconds"]  # noqa: E731
    alone = rate(by["hf:assisted-2", 0, 0]) / rate(by["hf:target", 0, 0])
    assert saved["summary"]["hf:assisted-2"]["all"]["speedup"] == pytest.approx(alone, rel=1e-12)
    md = (tmp_path / "b.md").read_text()
    assert f"The bench was cut short:\n- {why}." in md
    assert "| hf:assisted-2 | - | " in md  # no chat run: a dash, not 0.00 tok/s

    def interrupted(kind, k):  # Ctrl-C in transformers' target alone's third timed run (after its warm-up)
        run = real_hf(kind, k)
        seen = []

        def runner(on, ids, n):
            seen.append(ids)
            if len(seen) == 4:
                raise KeyboardInterrupt
            return run(on, ids, n)
        return runner

    monkeypatch.setattr(bench, "hf_method", interrupted)
    argv[8] = "hf:target,specviz:none"
    assert cli.main(argv) == 130
    saved = json.loads(out.read_text())
    assert [(r["method"], r["repeat"], r["prompt"]) for r in saved["records"]] == [
        ("hf:target", 0, 0), ("specviz:none", 0, 0), ("hf:target", 0, 1), ("specviz:none", 0, 1)]
    assert saved["meta"]["stopped"] == ["interrupted (Ctrl-C) after 4 of 8 runs; the summary is of those"]

    def both(kind, k):  # assisted fails on prompt #1, then the Ctrl-C in repeat 1: of the 12 runs first
        return (breaking if kind == "assisted" else interrupted)(kind, k)  # planned, its 3 left are not

    monkeypatch.setattr(bench, "hf_method", both)
    argv[8] = "hf:target,hf:assisted-2,specviz:none"
    assert cli.main(argv) == 130
    assert json.loads(out.read_text())["meta"]["stopped"][-1] == ("interrupted (Ctrl-C) after 5 of 9 runs; "
                                                                  "the summary is of those")
    # no method finished a run: nothing to save, and the error says so
    monkeypatch.setattr(bench, "hf_method", lambda kind, k: lambda on, ids, n: 1 / 0)
    out.unlink()
    argv[8] = "hf:target"
    assert cli.main(argv) == 1 and not out.exists()
    assert ("no method finished a run, so nothing is saved:\n  hf:target failed warming up: "
            "ZeroDivisionError: division by zero") in capsys.readouterr().err


def test_after_a_failure_or_a_ctrl_c_vs_hf_compares_speedups_over_the_same_prompts():
    """specviz:draft-2 against hf:assisted-2, each over its own family's target alone, on two code
    prompts: 60 tokens each; seconds by hand. A Ctrl-C during draft-2's second prompt dropped its
    "vs hf" (the twin had one run more); hf:target failing on the second prompt left assisted's
    speedup over prompt 0 against draft-2's over both (2.14 where prompt 0 gives 1.0). Both are
    now over the prompts all four made: prompt 0, draft 2x its target, assisted 2x its."""
    def r(method, family, prompt, seconds):
        return Record(method, family, 2, prompt, "code", 0, 60, seconds)

    full = {("hf:target", "transformers"): (20.0, 10.0), ("specviz:none", "specviz"): (20.0, 40.0),
            ("hf:assisted-2", "transformers"): (10.0, 2.0), ("specviz:draft-2", "specviz"): (10.0, 4.0)}
    cut = [r(m, f, p, s[p]) for (m, f), s in full.items() for p in (0, 1)
           if (m, p) != ("specviz:draft-2", 1)]  # the Ctrl-C
    row = benchreport.summarize(cut)["specviz:draft-2"]["code"]
    assert (row["vs_transformers"], row["vs_transformers_method"]) == (1.0, "hf:assisted-2")  # 2x / 2x
    failed = [r(m, f, p, s[p]) for (m, f), s in full.items() for p in (0, 1) if (m, p) != ("hf:target", 1)]
    s = benchreport.summarize(failed)
    assert s["hf:assisted-2"]["code"]["speedup"] == 2.0  # over prompt 0, the one its target ran
    assert s["specviz:draft-2"]["code"]["speedup"] == (120 / 14) / (120 / 60)  # both prompts: 4.29x
    assert s["specviz:draft-2"]["code"]["vs_transformers"] == 1.0  # prompt 0: 2x against 2x
    whole = benchreport.summarize([r(m, f, p, s_[p]) for (m, f), s_ in full.items() for p in (0, 1)])
    assert whole["specviz:draft-2"]["code"]["vs_transformers"] == ((120 / 14) / (120 / 60)) / (
        (120 / 12) / (120 / 30))  # nothing missing: every run, as before
