#!/usr/bin/env bash
# make gpu-check  (= bash experiments/gpu_check.sh): the checks that need a CUDA GPU, in under ~8 minutes on one.
#   1. pytest -m gpu: decoders at T=0 equal greedy on CUDA in fp16; NVML energy readings are positive.
#   2. a short sweep of the embedded pair (SmolLM2-135M-Instruct + its draft) on CUDA with NVML energy:
#      rows in results/gpu/gpu_check.jsonl, table in results/gpu/tables/gpu_check.md, log in results/gpu/.
# Without CUDA it says so, runs the GPU tests (they skip) and exits 0. PY=... picks the interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PY:-.venv/bin/python}"
OUT="${GPU_CHECK_DIR:-results/gpu}"
PROMPTS="${GPU_CHECK_PROMPTS:-5}"
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: no CUDA device visible to $PY: running the GPU tests, which skip, and nothing else"
    "$PY" -m pytest -q -m gpu tests/test_gpu.py
    exit 0
fi
mkdir -p "$OUT"
LOG="$OUT/gpu_check_$(date -u +%Y%m%dT%H%M%SZ).log"
exec > >(tee -a "$LOG") 2>&1
"$PY" -c 'import torch; print("gpu-check on", torch.cuda.get_device_name(0), "torch", torch.__version__, "CUDA", torch.version.cuda)'

echo "== 1/2 pytest -m gpu"
timeout 180 "$PY" -m pytest -q -m gpu tests/

echo "== 2/2 embedded pair on CUDA, NVML energy -> $OUT"
DECODERS="greedy,sampling,speculative,specinfer,mtjd,mtad,mmtad"
if [ ! -f models/smollm2-draft/config.json ]; then
    echo "gpu-check: models/smollm2-draft is missing (make train-draft): target-only decoders only"
    DECODERS="greedy,sampling,mtjd"
fi
timeout 300 "$PY" -m mtad.reproduce --experiment cpu_table --no-progress \
    name=gpu_check results_dir="$OUT" model.device=cuda num_threads=0 \
    "decoder=$DECODERS" task=gsm8k,mt_bench "task.n_prompts=$PROMPTS" decoder.max_new_tokens=64

"$PY" - "$OUT/gpu_check.jsonl" <<'PYEOF'
import sys
from mtad.results import load_results
rows = [r for r in load_results(sys.argv[1]) if r["model"]["device"] == "cuda"]
print(f"{'decoder':<12} {'task':<9} {'ms/token':>9} {'J/token':>9} {'source':>6}  device")
for r in rows:
    m = r["metrics"]
    jpt = m.get("energy_j_per_token")
    print(f"{r['decoder']['name']:<12} {r['task']['name']:<9} {m['ms_per_token']:>9.2f} "
          f"{(f'{jpt:.4f}' if jpt is not None else '-'):>9} {str(m.get('energy_source')):>6}  {r['device_name']}")
missing = [r["decoder"]["name"] for r in rows if r["metrics"].get("energy_source") != "nvml"]
if not rows or missing:
    sys.exit(f"gpu-check: rows without an NVML energy reading: {missing or 'no CUDA rows at all'}")
print(f"gpu-check: OK, {len(rows)} CUDA rows with NVML energy")
PYEOF
