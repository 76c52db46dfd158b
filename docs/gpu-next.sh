#!/usr/bin/env bash
# The next device call, prepared: one run of about 9.5 minutes on the H200 (a session has 15, the
# machine's start included), seven files back under $OUT (gpucheck's report and profile written
# after each of its sections, so a timeout leaves what it measured). From the repo root:
#   run(command="bash docs/gpu-next.sh", timeout_s=600)
# 1. graphprobe: the compiled path's steps with one graph for every wide pass (the default), unpacked
#    and packed, timed side by side; the packed one's float32 identity against eager; for each, the
#    kernel tables of a 1-token and a 5-token target pass and a draft pass, with every kernel of one
#    pass in order (each mode saved before its identity check).
# 2. gpucheck on the defaults: the goals, the cost profile, and the engine's bfloat16 runs against
#    the target alone (its "self", tree and chain sections, as far as its budget reaches).
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/specviz-gpu}
mkdir -p "$OUT"
start=$SECONDS
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1  # the driver, clocks and memory as the run began
# (the inductor cache is the machine's: gpucheck's compiles after the probe's may be warm, so its
# first-use seconds are not a cold compile's; the pass times are unaffected)
timeout -k 15 250 python3 -m specviz.graphprobe --widths "" --modes direct+shared,direct+packed+shared \
  --identity direct+packed+shared --profile "$OUT/kernels.txt" --out "$OUT/probe.json" 2>&1 | tee "$OUT/probe.log"
echo "probe: $((SECONDS - start)) s"
left=$((560 - (SECONDS - start)))
timeout -k 15 "$left" python3 -m specviz gpucheck --device cuda --budget $((left - 40)) --out "$OUT" 2>&1 \
  | tee "$OUT/gpucheck.log"
echo "total: $((SECONDS - start)) s"
