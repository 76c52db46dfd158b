"""The benchmark's bookkeeping (exact, on synthetic records) and a tiny end-to-end run."""

import json

from specviz import bench
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
    s = bench.summarize(records)
    assert s["specviz:none"]["edit"]["vs_transformers"] == 20.0 / 19.0  # tok/s ratio
    assert s["hf:assisted-4"]["edit"]["speedup"] == 2.0 and s["specviz:draft-4"]["edit"]["speedup"] == 19 / 8
    assert s["specviz:draft-4"]["edit"]["vs_transformers"] == (19 / 8) / 2.0
    # the hybrid is measured against the better of assisted (2.0x) and lookup (4.0x)
    assert s["specviz:hybrid-8"]["edit"]["vs_transformers"] == (19 / 4) / 4.0
    assert s["specviz:draft-4"]["all"]["tokens_per_pass"] == 6.0
    text = bench.markdown(s, {"machine": bench.machine(), "target": "t", "draft": "d", "dtype": "bf16",
                              "device": "cpu", "max_new_tokens": 64, "repeats": 1})
    assert "| specviz:hybrid-8 |" in text and "1.19 vs hf" in text


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
            "hf:lookup-8", "specviz:hybrid-8", "specviz:adaptive", "hf:assisted-4-qdraft"} - methods \
        == {"hf:assisted-4-qdraft"}  # quantized-draft counterpart only when k=4 is benchmarked
    # float32 tiny models: every method reproduces the target alone exactly
    assert all(r["matches_target"] for r in data["records"])
    # transformers' target passes are counted like specviz's: one per token alone, fewer with help
    by = {(r["method"], r["prompt"]): r for r in data["records"]}
    for i in (0, 1):
        assert by["hf:target", i]["target_passes"] == by["hf:target", i]["tokens"]
        assert by["hf:target", i]["target_passes"] == by["specviz:none", i]["target_passes"]
        assert 1 <= by["hf:assisted-2", i]["target_passes"] <= by["hf:target", i]["tokens"]
    assert data["summary"]["hf:target"]["all"]["tokens_per_pass"] == 1.0
    # both n-gram rules replayed on the target's own text: at least one token per pass
    assert set(data["same_text_passes"]) == {"code", "text"}
    for row in data["same_text_passes"].values():
        assert set(row) == {"specviz:ngram-8", "hf:lookup-8"}
        assert all(1 <= n <= 12 for n in row.values())
    assert "fewer is better" in (tmp_path / "b.md").read_text()
    assert "specviz:draft-2" in (tmp_path / "b.md").read_text()
    assert (tmp_path / "b.html").stat().st_size > 1000


def test_costs_report_every_format_and_verified_length(model_dirs, capsys):
    from specviz.cli import main

    rc = main(["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--repeats", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["draft_ms"]) == {"none", "int8", "int4"}
    assert [int(n) for n in out["target_ms"]] == [1, 2, 3, 5, 9, 17]
    assert all(ms > 0 for ms in [*out["draft_ms"].values(), *out["target_ms"].values()])
    rc = main(["costs", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--repeats", "1", "--profile"])
    assert rc == 0 and "Self CPU" in capsys.readouterr().out


def test_passes_on_text_counts_rounds_exactly():
    out = [4, 5, 6, 7]
    assert bench.passes_on_text([1, 2, 3], out, lambda ids, budget: []) == 4  # one token a pass
    oracle = lambda ids, budget: out[len(ids) - 3:][:budget]  # noqa: E731
    assert bench.passes_on_text([1, 2, 3], out, oracle) == 1  # 3 kept + the target's own
    # keeps 4, 5, then the target says 6; the last round proposes nothing (no budget left)
    assert bench.passes_on_text([1, 2, 3], out, lambda ids, budget: [4, 5, 9][:budget]) == 2


def test_lookup_rules_are_transformers_and_specviz_ngram(pair):
    rules = bench.lookup_rules(pair, [5, 1, 2, 3], max_new_tokens=16)
    ids = [5, 1, 2, 3, 5]
    # transformers: the earliest match of the last 2, then 1 tokens; everything that followed
    assert rules["hf:lookup-8"](ids, 8) == [1, 2, 3, 5] and rules["hf:lookup-8"](ids, 2) == [1, 2]
    assert rules["specviz:ngram-8"](ids, 8) == [1, 2, 3, 5]


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
