"""python -m specviz gpucheck: what the embedded pair's passes cost here, eager against the fast path.

One command, no downloads, torch + transformers only (no gradio, plotly or psutil on its import
path), so it runs on a bare GPU machine with older packages. It builds the embedded pair's two
architectures (assets/configs/) with seeded random weights, and, when the embedded cache is
present, also times the real pair. It reports:

- the copy bandwidth (a large device tensor copy, bytes read plus written, median);
- C_D (draft, 1 token) and C_T(w) (target, w tokens verified) on the eager path (DynamicCache,
  eager forwards) and the fast path (StaticCache; on CUDA its fixed-shape steps compiled with
  torch.compile and captured as CUDA graphs, as fastpath.CAPTURE says), and on CUDA the graphed path
  (ZeroGPU's: the uncompiled steps captured as CUDA graphs) while the budget lasts;
- the target alone's tokens per second against the bandwidth limit (weight bytes a pass reads over
  the measured copy bandwidth);
- fast-path greedy output against eager on the same weights in float32 (a width-1 greedy decode,
  and speculative-style verify rounds of width k+1 with some drafts corrupted, so the static
  cache is rolled back past rejected tokens), and eager against a cache-free forward;
- the projected speedup per k and drafter (profiles.projection, acceptance measured on CPU);
- the engine's own rounds end to end (enginecheck): how much of a round is neither the draft's
  passes nor the verify pass, against what the profile projects for the same passes, and whether
  each run's output is the target alone's (with the target drafting for itself first: nearly
  every draft accepted, so every row of a verify pass is checked);
- each goal of the GPU issue as met / not met.

It writes the pass costs as a cost profile (specviz.profiles) that the k explorer and the bench
replay recorded runs onto. Pass times are host wall-clock between device synchronizations (what
a round waits for, launch overhead included); medians of repeats. Sections run in priority
order under a time budget, and whatever would overrun it is reported as skipped.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from . import dense, enginecheck, fastpath, lm, profiles, quant
from .digits import beside
from .gpumeasure import (
    IDENTITY_KEYS,
    ROLES,
    Clock,
    Settings,
    config,
    copy_bandwidth,
    fast_available,
    identity,
    preflight,
    random_model,
    random_pair,
    real_cached,
    real_models,
    time_path,
    weight_bytes,
)

# ---- the check -----------------------------------------------------------------------------

def hardware(device: str, bandwidth: float) -> dict:
    cpus = os.cpu_count() or 0
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"device": "cuda", "name": props.name[:100],
                "memory_gib": round(props.total_memory / 2**30, 1),
                "cpus": cpus, "copy_gbs": round(bandwidth, 1)}
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    name = (f"{platform.machine() or 'cpu'}, {cpus} CPUs, torch {torch.get_num_threads()} threads, "
            f"{'bf16 in hardware' if dense.native_bf16() else 'no bf16 hardware'}")  # a wide pass's price
    return {"device": device, "name": name, "memory_gib": round(memory, 1), "cpus": cpus,
            "copy_gbs": round(bandwidth, 2)}


def packages() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "cuda": torch.version.cuda}


def loadavg() -> float | None:
    """The 1-minute load average (other processes sharing the CPU slow its timings)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def load_note(load: list) -> str:
    if None in load:
        return ""
    cpus = os.cpu_count() or 1
    shared = " (above the CPU count, other work shared them)" if max(load) > cpus else ""
    return f"; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end, on {cpus} CPUs{shared}"


def slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    return "-".join(p for p in out.split("-") if p)[:50]


def as_the_engine_drafts(models: dict, codes: Path | None = None) -> str | None:
    """Quantize the draft in place as the engine's default does on this device (draft_quant "auto":
    int4 weights on a CPU, none on CUDA); its label, or None. A CPU profile timed the bf16 draft
    the engine never runs there: C_D 102 ms on a machine whose bench ran the int4 draft at about
    27 ms a pass (on an AVX2 CPU int4 gains less: 56-76 ms against bf16's 68). codes: the int4
    groups kept beside the draft's weights (quant.codes_file), read where they are, as a load does."""
    return quant.apply(models["draft"], "auto", codes)


def failure(e: Exception) -> str:
    """A section's error as its skipped line says it: the type and the message's first line."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


REAL_SHARE = 0.4  # of the budget: the real pair's section starts only with this much left, and keeps it


def run(s: Settings, log=print, checkpoint=None) -> dict:
    """The whole check: a report dict (with the profile under "profile"). checkpoint(report), if
    given, receives the report so far (marked "partial") after each section, so that a run cut
    short by a timeout still leaves what it measured."""
    if s.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device here: run with --device cpu")
    if s.compile:
        for name in ("cache_size_limit", "recompile_limit"):  # one graph per shape and model
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    clock, skipped, started_load = Clock(s.budget), [], loadavg()
    preflight(s.device)
    dtype = getattr(torch, s.dtype)
    bandwidth = copy_bandwidth(s.device, s.copy_mib)
    log(f"copy bandwidth: {bandwidth:.1f} GB/s (read + write, {s.copy_mib} MiB)")
    models = random_pair(s.device, dtype, s.quick)
    sizes = {role: (sum(p.numel() for p in m.parameters()), *weight_bytes(m)) for role, m in models.items()}
    drafted_as = as_the_engine_drafts(models)
    paths_ok = ["eager"] + (["fast"] if fast_available() else [])
    if not fast_available():
        skipped.append("fast path: this specviz's CachedLM has no cache= option")

    def assemble(partial: bool) -> dict:
        """The report from what has been measured so far."""
        loads = [started_load, loadavg()]  # at the start, and now
        hw = hardware(s.device, bandwidth)
        name = slug(("" if s.device == "cuda" else "cpu-") + hw["name"].split(",")[0]
                    + f"-{s.dtype}" + ("-quick" if s.quick else ""))
        costs = {p: profiles.PathCosts(
            c["cache"], c["compiled"], c.get("draft_ms"),
            tuple(sorted((int(w), float(ms)) for w, ms in c["target_ms"].items())), s.dtype, c["max_len"],
            "" if c.get("compiled_ok", True) else "compiled capture failed: eager steps")
            for p, c in paths.items()}
        tiny = " (quick: tiny widths)" if s.quick else ""
        kind = {"draft": f", {drafted_as}, as the engine drafts here" if drafted_as else ""}
        described = {role: {"name": f"{ROLES[role]} architecture, random weights{tiny}{kind.get(role, '')}",
                            "params": sizes[role][0], "weight_bytes": sizes[role][1], "dtype": s.dtype,
                            "config": f"assets/configs/{ROLES[role]}/config.json"} for role in ROLES}
        command = command_of(s, every=True)
        profile = profiles.Profile(name, hw, packages(), costs, described,
                                   datetime.date.today().isoformat(), s.quick,
                                   f"measured by `{command}`" + load_note(loads)
                                   + ("; PARTIAL: written after a section, before the run ended" if partial
                                      else ""))
        report = {"format": "specviz-gpucheck", "version": 1, "partial": partial, "settings": dict(vars(s)),
                  "steps": {"capture": fastpath.CAPTURE,
                            **{f: getattr(fastpath, name) for f, name, _ in STEP_FLAGS},
                            "candidates": lm.CANDIDATES},
                  "seconds": round(clock.elapsed, 1), "skipped": skipped, "bandwidth_gbs": bandwidth,
                  "weights": {r: {"params": n, "bytes": t, "read_per_pass": p}
                              for r, (n, t, p) in sizes.items()},
                  "paths": paths, **result, "profile": profile.to_dict(), "load_average": loads}
        both = [r for r in (result["identity"], result["real_identity"]) if r]
        ident = None if not both else {k: all(r.get(k) for r in both)
                                       for k in IDENTITY_KEYS if k in both[0]}
        if ident is not None:  # False where a capture failed (None: the path compiles nothing)
            ident["compiled_ok"] = all(r.get("compiled_ok") is not False for r in both)
        return report | summary(profile, sizes["target"][2], bandwidth, ident, s.k)

    def save() -> None:
        """Hand the report so far to checkpoint (a failure to assemble it never stops the run)."""
        if checkpoint is not None:
            try:
                checkpoint(assemble(partial=True))
            except Exception as e:  # noqa: BLE001 - a snapshot: the final report still comes
                log(f"(could not save the report so far: {type(e).__name__}: {e})")

    def logged(path: str) -> dict:
        c = paths[path]
        log(f"{path}: draft {c['draft_ms']:.3f} ms, target " + ", ".join(
            f"{w}: {ms:.3f}" for w, ms in sorted(c["target_ms"].items())) + " ms")
        return c

    # priority: every eager width, the graphed path, the fast widths the goals read (1 and k+1),
    # the identity check, then the rest while the budget lasts
    result = {"identity": None, "real": None, "real_identity": None, "engine": {}}
    paths = {"eager": time_path(models, "eager", s, clock, s.eager_widths, skipped, "random")}
    logged("eager")
    save()
    # ZeroGPU's path next: its captures take a fraction of a second, and its models must be as
    # loaded, before the compiled path packs them in place (fastpath.PACK)
    if "fast" in paths_ok and s.device in fastpath.GRAPH_DEVICES:
        try:  # never run through CachedLM on a GPU yet: a failure outside its steps' own fallback
            paths["graphed"] = time_path(models, "graphed", s, clock, s.fast_widths, skipped, "random")
            logged("graphed")
        except Exception as e:  # noqa: BLE001 - (slots, packing, the head) must not cost the goals after it
            skipped.append(f"graphed path: {failure(e)}")
            log(f"graphed path failed, left out: {skipped[-1]}")
        save()
    first = tuple(w for w in s.fast_widths if w in (1, s.k + 1))
    if "fast" in paths_ok:
        paths["fast"] = time_path(models, "fast", s, clock, first, skipped, "random")
        logged("fast")
        save()
    if clock.left() > 0.2 * s.budget or s.quick:
        try:  # a failure here (out of memory beside the bf16 pair) must not cost the engine rounds
            model32 = random_model(config("target", s.quick), s.device, torch.float32, seed=0)
            result["identity"] = identity(model32, s)
            log(f"identity (float32): {json.dumps(result['identity'])}")
        except Exception as e:  # noqa: BLE001 - the identity goal is then not measured
            skipped.append(f"float32 identity check: {failure(e)}")
            log(f"identity check failed, left out: {skipped[-1]}")
        model32 = None  # its memory back before the engine rounds
        save()
    else:
        skipped.append("float32 identity check (time budget)")
    rest = tuple(w for w in s.fast_widths if w not in first)
    real_pending = s.real and real_cached()
    reserve = REAL_SHARE * s.budget if real_pending else 0.0  # kept for the real pair's section

    def engine(models: dict, kind: str, captures: int) -> None:
        """The engine's own rounds (enginecheck) while the budget lasts: `captures` new shapes,
        each priced at the costliest fast width so far (its capture included), and a margin."""
        capture = max(paths["fast"]["seconds"].values(), default=0.0)
        if clock.left() < max(reserve, 0.05 * s.budget) + (captures + 0.5) * capture and not s.quick:
            skipped.append(f"engine rounds, {kind} (time budget)")
            return
        try:
            result["engine"][kind] = enginecheck.engine_run(
                models, "compiled" if s.compile else "static", kind, s.k, s.context, s.engine_tokens)
            log(f"engine rounds, {kind}: {json.dumps(result['engine'][kind])}")
        except Exception as e:  # noqa: BLE001 - a measurement: say what failed, keep the rest
            skipped.append(f"engine rounds, {kind}: {failure(e)}")

    # after the goals: the promise in bfloat16 on every row of a verify pass (the target drafting
    # for itself: its draft steps, 1 and 2 tokens, captured anew); the profile's other widths; a
    # tree's masked passes through graphs (three captures); the random draft's chain (its draft
    # steps anew). On an H200 a compiled shape's first use took 18-32 s: a 270 s budget reaches
    # about the first two.
    if "fast" in paths_ok and rest:  # with one graph for every wide pass, a capture each
        time_path(models, "fast", s, clock.keeping(reserve), rest, skipped, "random", into=paths["fast"],
                  margin=2.0)
        logged("fast")
        save()
    if "fast" in paths_ok:
        for kind, captures in (("self", 2), ("tree", 3), ("chain", 2)):
            engine(models, kind, captures)
            save()
    del models
    if s.real and clock.left() > REAL_SHARE * s.budget:
        real = real_models(s.device, dtype)
        if real is None:
            skipped.append("real pair: the embedded cache is not built here")
        else:
            from . import embedded  # the embedded draft's cache keeps its int4 codes (loading does)

            as_the_engine_drafts(real, quant.codes_file(embedded.cache_dir(embedded.DRAFT)))
            quick = replace(s, fast_widths=(1, s.k + 1), eager_widths=(1, s.k + 1))
            result["real"] = {p: time_path(real, p, quick, clock, quick.fast_widths, skipped, "real")
                              for p in paths_ok}
            log(f"real pair: {json.dumps(result['real'])}")
            del real
            if clock.left() > 0.25 * s.budget:
                target32 = real_models(s.device, torch.float32, roles=("target",))["target"]
                result["real_identity"] = identity(target32, s)
                log(f"real target identity (float32): {json.dumps(result['real_identity'])}")
                del target32
            else:
                skipped.append("real pair: float32 identity check (time budget)")
    elif s.real:
        skipped.append("real pair (time budget)")
    return assemble(partial=False)


def summary(profile: profiles.Profile, read_bytes: int, bandwidth: float, ident: dict | None, k: int) -> dict:
    """The target alone against the bandwidth limit, the projection per k and drafter, the goals."""
    limit_ms = read_bytes / (bandwidth * 1e9) * 1e3
    alone = {p: {"ms": c.target_seconds(1) * 1e3, "tokens_per_second": 1 / c.target_seconds(1),
                 "over_limit": c.target_seconds(1) * 1e3 / limit_ms} for p, c in profile.paths.items()}
    projection = {p: profiles.projection(profile, p) for p in profile.paths}
    fast = profile.paths.get("fast")
    eager = profile.paths["eager"]
    at_k = next((r for r in projection.get("fast", []) if r["drafter"] == f"draft-{k}"), None)
    if fast is not None and k + 1 not in dict(fast.target_ms):
        at_k = None  # C_T(k+1) not measured (time budget): an extrapolation is no verdict

    # a failed capture times the fast path's eager fallback (its note says so): its figures are kept,
    # and no goal of the captured steps is judged on them (four missed goals of a path never timed)
    fell_back = fast is not None and bool(fast.note)

    def goal(text: str, value, met, bar: float | None = None, of_fast: bool = True) -> dict:
        """bar: the number the value is judged against, so that its printed digits agree."""
        judged = value is not None and not (of_fast and fell_back)
        return {"goal": text + (f" ({fast.note}: not judged)" if of_fast and fell_back else ""),
                "value": value, "met": bool(met) if judged else None, "bar": bar}

    speedup = None if fast is None else eager.target_seconds(1) / fast.target_seconds(1)
    ratio = None if fast is None or fast.draft_seconds is None else \
        fast.draft_seconds / fast.target_seconds(1)
    same = None
    if ident and "fast_greedy_equals_eager" in ident and ident.get("compiled_ok") is not False:
        # a failed capture falls back to eager steps: eager against eager says nothing of the path
        same = all(ident[key] for key in IDENTITY_KEYS)
    over = alone.get("fast", {}).get("over_limit")
    goals = [goal("target alone: fast path >= 4x faster than eager", speedup,
                  speedup is not None and speedup >= 4, 4),
             goal("target alone on the fast path within 3x of the bandwidth limit", over,
                  over is not None and over <= 3, 3),
             goal("C_D/C_T <= 0.5 on the fast path", ratio, ratio is not None and ratio <= 0.5, 0.5),
             goal(f"projected draft speedup at k={k} >= 2x (fast path)", at_k and at_k["speedup"],
                  at_k is not None and at_k["speedup"] >= 2, 2),
             goal("fast-path greedy identical to eager (float32)", same, same, of_fast=False)]
    return {"bandwidth_limit_ms": limit_ms, "bandwidth_limit_tokens_per_second": 1e3 / limit_ms,
            "target_alone": alone, "projection": projection, "goals": goals}


def steps_line(report: dict) -> str:
    """How the fast path's steps were built, as far as they apply where it ran: packing and tuning
    only where steps are captured as graphs (fastpath.GRAPH_DEVICES), nothing where nothing compiled."""
    steps, settings = report.get("steps") or {}, report["settings"]
    if not steps or not settings.get("compile"):
        return "fast path: static caches, eager steps (nothing compiled)"
    graphs = settings["device"] in fastpath.GRAPH_DEVICES
    return ("compiled steps: " + (f"capture {steps['capture']}, " if graphs else "no graphs (not CUDA), ")
            + (f"{'packed' if steps['pack'] else 'unpacked'} projections, " if graphs else "")
            + f"{'one layer compiled for all' if steps.get('nested') else 'every layer traced'}, "
            + f"{'one graph for all widths over 1' if steps.get('shared') else 'a graph a width'}, "
            + (f"coordinate-descent tuning {'on' if steps.get('tuned') else 'off'}, " if graphs else "")
            + f"head refined over the top {steps['candidates']} logits first")


def command_of(s: Settings, every: bool = False) -> str:
    """The gpucheck command that measures as s and lm's step settings say: the step flags that
    differ from lm's defaults, or every one of them (every: a profile's note, the one record of how
    its costs were measured, must stay true when a later specviz changes the defaults)."""
    default = Settings.for_device(s.device, s.quick)
    words = ["python -m specviz gpucheck --device", s.device] + (["--quick"] if s.quick else [])
    if s.dtype != default.dtype:
        words += ["--dtype", s.dtype]
    if s.compile != default.compile:
        words += ["--compile", "on" if s.compile else "off"]
    if s.compile:
        words += [w for flag, name, _ in STEP_FLAGS if every or getattr(fastpath, name) != STEP_DEFAULTS[name]
                  for w in (f"--{flag}", "on" if getattr(fastpath, name) else "off")]
    return " ".join(words)


def text(report: dict) -> str:
    """The report for a terminal: pass costs, the target alone, the projection, the goals."""
    prof, lines = report["profile"], []
    hw, pk = prof["hardware"], prof["packages"]
    lines.append(f"specviz gpucheck on {hw['name']} ({hw['device']}): torch {pk['torch']}, transformers "
                 f"{pk['transformers']}, python {pk['python']}, CUDA {pk['cuda']}; {report['seconds']} s"
                 + (" (quick: tiny widths, the real depths)" if prof["quick"] else ""))
    lines.append(steps_line(report))
    lines.append(f"copy bandwidth {report['bandwidth_gbs']:.1f} GB/s; target reads "
                 f"{report['weights']['target']['read_per_pass'] / 1e9:.3f} GB a pass: limit "
                 f"{report['bandwidth_limit_ms']:.3f} ms, "
                 f"{report['bandwidth_limit_tokens_per_second']:.0f} tok/s")
    labels = profiles.from_dict(prof)
    for name, path in prof["paths"].items():
        lines.append(f"{labels.path_label(name)}: C_D {path['draft_ms']:.3f} ms; C_T by width: "
                     + ", ".join(f"{w}: {ms:.3f}" for w, ms in path["target_ms"].items()) + " ms")
        if path["compiled"]:  # what each width's first use (its capture) cost, with its timing
            measured = report["paths"][name]
            lines.append(f"  {name}: seconds per width, capture included: {measured['seconds']}, "
                         f"draft {measured.get('draft_seconds')}; "
                         f"captures ok: {measured.get('compiled_ok')}")
    for name, a in report["target_alone"].items():
        lines.append(f"target alone, {name}: {a['ms']:.3f} ms/token, {a['tokens_per_second']:.1f} tok/s, "
                     f"{beside(a['over_limit'], 3, 1)}x the bandwidth limit")
    lines.append("projected (acceptance measured on CPU, docs/bench-cpu-2026-11-30.json; the n-gram's "
                 "round widths, docs/bench-hf-cpu-2026-12-07.json):")
    lines += projection_lines(report["projection"])
    if report.get("identity"):
        lines.append(f"identity (float32, random weights): {json.dumps(report['identity'])}")
    if report.get("real_identity"):
        lines.append(f"identity (float32, the real target): {json.dumps(report['real_identity'])}")
    if report.get("real"):
        for name, path in report["real"].items():
            lines.append(f"real pair, {name}: C_D {path.get('draft_ms', 0):.3f} ms; C_T "
                         + ", ".join(f"{w}: {ms:.3f}" for w, ms in path["target_ms"].items()) + " ms")
    if report.get("engine"):
        lines += enginecheck.lines(report["engine"], profiles.from_dict(prof))
    for item in report["skipped"]:
        lines.append(f"skipped: {item}")
    return "\n".join(lines + goal_lines(report["goals"]))


def projection_lines(projection: dict[str, list[dict]]) -> list[str]:
    """The projection table, a column pair per path; "-" where a path has no draft cost, and "*"
    on a row priced at a verify wider than its path measured (a budget cut the widths short: the
    rows said 2.77x at k=4 with only C_T(1) measured, verifying priced as free)."""
    by_path = {p: {r["drafter"]: r for r in rows} for p, rows in projection.items()}
    lines = [f"  {'drafter':10}" + "".join(f"{p + ' ms/tok':>16}{p + ' speedup':>18}" for p in by_path)]
    for drafter in dict.fromkeys(d for rows in by_path.values() for d in rows):
        # the speedups beside the goal's 2x bar and parity: 1.996 is not printed 2.00, 0.996 not 1.00
        cells = [f"{r['ms_per_token']:16.3f}{beside(r['speedup'], (1, 2)):>16}x"
                 + ("*" if r.get("extrapolated") else " ") if (r := rows.get(drafter))
                 else f"{'-':>16}{'-':>17} " for rows in by_path.values()]
        lines.append(f"  {drafter:10}" + "".join(cells))
    if any(r.get("extrapolated") for rows in projection.values() for r in rows):
        lines.append("  * C_T(k+1) not measured: priced past the widest pass its path measured (along the "
                     "last two widths, or flat at the one), an estimate and no verdict")
    return lines


def goal_lines(goals: list[dict]) -> list[str]:
    """Each goal's verdict and value, its digits never rounded onto the goal's bar."""
    lines = ["goals (set for an H200):"]
    for g in goals:
        value = g["value"] if isinstance(g["value"], bool) or g["value"] is None \
            else beside(g["value"], g["bar"]) if g.get("bar") is not None else f"{g['value']:.2f}"
        state = ("not measured" if g["value"] is None else "not judged") if g["met"] is None \
            else "met" if g["met"] else "NOT MET"
        lines.append(f"  {state:12} {g['goal']}: {value}")
    return lines


def add_gpucheck_args(p) -> None:
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    p.add_argument("--quick", action="store_true", help="tiny widths (real depths), fewer repeats")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="timing dtype (default bfloat16)")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="fast path through torch.compile (auto: on CUDA only)")
    p.add_argument("--repeats", type=int, help="timed passes per measurement (median)")
    p.add_argument("--budget", type=float,
                   help="seconds for the whole check (default 270 on CUDA, 900 on a CPU, 120 with --quick); "
                        "--quick runs the identity and engine sections whatever is left (the small "
                        "form the tests run whole)")
    p.add_argument("--no-real", action="store_true", help="skip the real pair even when it is cached")
    add_step_args(p)
    p.add_argument("--out", default="gpucheck-out", help="folder for gpucheck.json and the cost profile "
                                                         "<name>.json (default: gpucheck-out)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a goal was measured and not met, or the fast path's capture "
                        "failed (a goal the run left 'not measured', for want of time or of a fast "
                        "path, does not count)")


# how the compiled path builds its steps: (flag, the lm setting it sets, what it does)
STEP_FLAGS = (("pack", "PACK", "pack q/k/v and gate/up, grouped attention"),
              ("nested", "NESTED", "compile one decoder layer for all"),
              ("shared", "SHARED", "one graph for every width of 2 or more tokens"),
              ("tuned", "TUNED", "inductor's coordinate-descent tuning (one-token matrix products as "
                                 "fused reductions)"))


STEP_DEFAULTS = {name: getattr(fastpath, name) for _, name, _ in STEP_FLAGS}  # as fastpath.py ships them


def add_step_args(p) -> None:
    """--pack, --nested, --shared and --tuned (STEP_FLAGS), each on or off."""
    for flag, name, what in STEP_FLAGS:
        p.add_argument(f"--{flag}", choices=["on", "off"],
                       help=f"compiled path: {what} (default: {'on' if getattr(fastpath, name) else 'off'})")


def apply_step_args(args) -> None:
    """lm's step settings as add_step_args's flags give them (unset: as they are)."""
    for flag, name, _ in STEP_FLAGS:
        if getattr(args, flag, None) is not None:
            setattr(fastpath, name, getattr(args, flag) == "on")


def atomically(path: Path, write) -> None:
    """write(a part file), then put it in path's place: a kill mid-write leaves the last whole one."""
    part = path.with_name(f".{path.name}.part")
    write(part)
    os.replace(part, path)


def writable(folder: Path) -> bool:
    """Whether a file can be made in folder, tried: root passes os.access on /proc, /sys and a
    read-only mount, and the check then ran its minutes to fail on saving the first section."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def cmd_gpucheck(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    apply_step_args(args)
    if args.repeats is not None and not 1 <= args.repeats <= 1000:
        raise ValueError("--repeats must be in 1..1000")
    if args.budget is not None and not 10 <= args.budget <= 3600:
        raise ValueError("--budget must be in 10..3600 seconds")
    compile_ = {"auto": None, "on": True, "off": False}[args.compile]
    s = Settings.for_device(device, args.quick, dtype=args.dtype, compile=compile_, repeats=args.repeats,
                            budget=args.budget, real=False if args.no_real else None)
    out = Path(args.out)
    # before the first section (a folder it cannot make failed minutes in, with a traceback), and
    # without making it (a check refused on its device left an empty one behind)
    near = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not near.is_dir() or not writable(near):
        raise ValueError(f"--out {args.out}: cannot make that folder ({near} is not a folder you can "
                         "write): give a folder you can write")

    def write(report: dict) -> None:
        """gpucheck.json and the cost profile under --out: after each section (marked partial, so a
        run a timeout kills leaves what it measured), then the whole report over them."""
        out.mkdir(parents=True, exist_ok=True)
        atomically(out / "gpucheck.json", lambda f: f.write_text(json.dumps(report, indent=1) + "\n"))
        atomically(out / f"{report['profile']['name']}.json",
                   lambda f: profiles.save(profiles.load(report["profile"]), f))

    report = run(s, log=(lambda line: None) if args.json else (lambda line: print(line, flush=True)),
                 checkpoint=write)
    write(report)
    print(json.dumps(report) if args.json else text(report))
    if not args.json:
        print(f"wrote {out / 'gpucheck.json'} and {out / (report['profile']['name'] + '.json')}")
    # a capture that failed leaves its goals "not judged": a failure of the path itself
    fell_back = (report["profile"]["paths"].get("fast") or {}).get("note")
    return 1 if args.strict and (fell_back or any(g["met"] is False for g in report["goals"])) else 0
