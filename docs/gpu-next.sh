#!/usr/bin/env bash
# The next device call, prepared: one run of about 9.5 minutes on the H200 (a session has 15, the
# machine's start included), the files back under $OUT (the probe's report after each mode,
# gpucheck's report and profile after each of its sections, so a timeout leaves what it measured).
# From the repo root, naming the H200 (issue 12's goals are an H200's; a call that names no kind
# starts an H100 first, with slower memory, whose figures would not compare with 2026-12-04's):
#   run(command="bash docs/gpu-next.sh", timeout_s=600, kind="nvidia-h200")
# (where no H200 is lent, an H100 still measures every ratio the goals state against eager and the
# bandwidth limit it measures itself: record it under its own name, beside the H200's, not over it)
# then, where status says 4 minutes or more of device time remain, the second call (the architecture
# sweep on CUDA, about 110 s): run(command="bash docs/gpu-sweep.sh", timeout_s=150, kind="nvidia-h200")
# 1. graphprobe: the compiled path's steps (one graph for every wide pass, the default) as they are,
#    then packed with inductor's coordinate-descent tuning (gpt-fast's setting: one-token matrix
#    products as fused Triton reductions), timed side by side, each with the kernel tables of a
#    1-token and a 5-token target pass and a draft pass. The probe stops at 240 s: a mode it did
#    not reach is left out of the choice below. (Until the fifty-ninth stop it also probed packing
#    without tuning and stopped at 330 s, which left gpucheck about 190 s: too little to reach the
#    engine's bfloat16 runs, which have never run on a GPU; a compile takes 18-32 s there.)
# 2. gpucheck under the fastest of them (graphprobe --fastest: the least cost of a k = 4 round, the
#    defaults unless another is more than 2% faster), with about 280 s (570 s in all, less the probe's
#    240, a few seconds of start-up and 40 kept for its report): the goals with its float32
#    identity against eager, the cost profile, and the engine's bfloat16 runs against the target
#    alone (the target drafting for itself, a tree, the draft's chain), as far as its budget
#    reaches. Its compiles of the probe's modes find the machine's inductor cache warm.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/specviz-gpu}
mkdir -p "$OUT"
start=$SECONDS
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1  # the driver, clocks and memory as the run began
# (the inductor cache is the machine's: gpucheck's compiles after the probe's may be warm, so its
# first-use seconds are not a cold compile's; the pass times are unaffected)
timeout -k 15 240 python3 -m specviz.graphprobe --widths "" \
  --modes direct+shared,direct+packed+tuned+shared \
  --profile "$OUT/kernels.txt" --out "$OUT/probe.json" 2>&1 | tee "$OUT/probe.log"
echo "probe: $((SECONDS - start)) s"
flags=$(python3 -m specviz.graphprobe --fastest "$OUT/probe.json" 2>>"$OUT/probe.log")
echo "gpucheck flags: ${flags:-(the defaults)}" | tee -a "$OUT/probe.log"
left=$((570 - (SECONDS - start)))
# shellcheck disable=SC2086 # the flags are words
timeout -k 15 "$left" python3 -m specviz gpucheck --device cuda --budget $((left - 40)) $flags --out "$OUT" \
  2>&1 | tee "$OUT/gpucheck.log"
echo "total: $((SECONDS - start)) s"
