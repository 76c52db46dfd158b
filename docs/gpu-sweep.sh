#!/usr/bin/env bash
# The second device call, prepared: the architecture sweep (docs/arch-sweep.py) on CUDA, about 110 s,
# the fast paths on architectures no GPU has run them on (sliding windows, ALiBi, OPT): "graphed"
# (fastpath.GraphedStep capturing torch.cuda.CUDAGraph directly, no compiler) and, as far as the time
# reaches, "compiled" (inductor, each shape then captured). Make it after docs/gpu-next.sh, in the
# same session, when status says 4 minutes of device time or more remain (the machine still warm: no
# new start), from the repo root:
#   run(command="bash docs/gpu-sweep.sh", timeout_s=150, kind="nvidia-h200")
# Files under $OUT: arch-sweep.jsonl (a header row a call: argv, device, GPU, torch, transformers,
# CUDA; then a row a model and a row a run) and arch-sweep.log (stdout and stderr, specviz's log
# lines and dynamo's among them), then a tally printed at the end.
# 1. graphed, with eager as the control on the same GPU: llama, mistral, gemma2 (sw16, sw192: a
#    16- or 192-token window), opt, phi3 (sw16, sw192), bloom, falcon_alibi, gpt_neox; proposers
#    draft and tree, k 4, 48 new tokens, float32. Archs not started by the budget are "skipped".
# 2. compiled, with what time is left (30 s or more): mistral sw16, then opt; draft, then tree.
# Outcomes, a run each:
#   identical  specviz's greedy output is the argmax loop's over full forwards on the GPU: the path
#              works there. Expected on every row not named below.
#   refused    expected for tree on bloom and falcon_alibi (ALiBi: no token trees, naming a chain
#              drafter); both resolve to a dynamic cache on 5.17 (arch.static_ready), so their
#              "graphed" rows run eager (compiled_passes 0, no log line). Any other refusal: a
#              check misfiring on CUDA or 5.17, read its msg.
#   opt        graphed and compiled rows identical with compiled_passes 0 and `logged` holding
#              "compiled step failed (...); running eager from now on" on the first run of each
#              model (target and draft): its forward reads the cache length on the host, which a
#              CUDA graph capture cannot (on CPU, whose compiled steps are not captured, the line is
#              "compiled 5 times for one shape" instead). A CRASH: the fallback after a failed
#              capture is broken; a MISMATCH with no line: a capture held a position baked in.
#   MISMATCH   a bug if gap_at (the top-two logit gap where it differs) is large (say > 1e-3); with
#              a small one a float32 near-tie between kernels of different widths: compare the
#              same arch's eager row (the same token there too: numerics, not the path).
#   CRASH      a bug of the path on CUDA (msg, and tb in the jsonl). Once a CUDA error is sticky
#              ("illegal memory access"), every later run crashes too: the first CRASH is the one.
#   HANG       a run past --limit. BUILD-FAIL: transformers 5.17 cannot build that config (recorded,
#              skipped). REF-FAIL: the model's own forward failed there (recorded, skipped).
#   skipped    the stage's budget ran out before that arch or run: rerun it with fewer archs.
# A stage that its timeout stops (rc 124) keeps every row it wrote. A compiled row whose `logged` says
# "Timeout: run exceeded the time limit": the compile outran --limit and the run finished eager.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/specviz-gpu}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of this script where there is no GPU
mkdir -p "$OUT"
rows="$OUT/arch-sweep.jsonl"
log="$OUT/arch-sweep.log"
rm -f "$rows" "$log"
start=$SECONDS
# stage 1: about 10 s of imports, then archs started within 45 s (a tiny model's run: 1-3 s)
timeout -k 5 75 python3 docs/arch-sweep.py --device "$DEVICE" --paths eager,graphed \
  --archs llama,mistral,gemma2,opt,phi3,bloom,falcon_alibi,gpt_neox --proposers draft,tree --ks 4 --n 48 \
  --budget 45 --limit 20 --out "$rows" 2>&1 | tee "$log"
echo "graphed: rc $?, $((SECONDS - start)) s" | tee -a "$log"
left=$((108 - (SECONDS - start)))
if [ "$left" -ge 30 ]; then
  # stage 2: inductor compiles each shape (seconds each on the H200): runs start within left - 25 s
  timeout -k 5 "$left" python3 docs/arch-sweep.py --device "$DEVICE" --paths compiled --archs mistral,opt \
    --variants sw16,plain --proposers draft,tree --ks 4 --n 48 --budget $((left - 25)) \
    --limit $((left - 15)) --out "$rows" 2>&1 | tee -a "$log"
  echo "compiled: rc $?, $((SECONDS - start)) s" | tee -a "$log"
else
  echo "compiled: not run, $left s left" | tee -a "$log"
fi
python3 - "$rows" <<'EOF' 2>&1 | tee -a "$log"
import json
import sys
from collections import Counter

try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError as e:
    sys.exit(f"no rows: {e}")
for r in rows:
    if r.get("header"):
        print("call:", r.get("gpu"), "torch", r["torch"], "transformers", r["transformers"],
              "cuda", r["cuda"], "compile", r["compile"], " ".join(r["argv"])[:160])
runs = [r for r in rows if "outcome" in r]
print("tally:", dict(Counter((r.get("path", "-"), r["outcome"]) for r in runs)))
for r in runs:
    what = f'{r["arch"]} {r["variant"]} {r.get("path", "")} {r.get("proposer", "")} {r.get("k", "")}'
    if r["outcome"] not in ("identical", "skipped"):
        at = f' at {r["at"]} gap {r["gap_at"]}' if "at" in r else ""
        print(f'{r["outcome"]}: {what}{at} {r.get("msg", "")[:70 if r["outcome"] == "refused" else 200]}')
    for line in r.get("logged", []):
        print(f"logged: {what} compiled_passes {r.get('compiled_passes')}: {line[:160]}")
print("models:", [(r["arch"], r["variant"], r["ref_vs_hf_generate"], round(r["min_gap"], 5))
                  for r in rows if "min_gap" in r])
EOF
echo "total: $((SECONDS - start)) s"
