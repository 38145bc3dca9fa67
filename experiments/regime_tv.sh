#!/usr/bin/env bash
# The first-token total variation to the target's law for every draft of the axis (results/regimes/drafts.tsv),
# beside the accepted-length study that skipped it (regime_axis.sh). The study's fixed TV contexts are the first
# prompts' half-way points with their own seeds and draws, so `--prompts N --tv-contexts N` gives the TV draws of
# the full study (the feature draft's full study, 2 contexts x 100 draws, is reproduced exactly by
# TV_CONTEXTS=2 TV_DRAWS=100: a check of that claim). TV_CONTEXTS (default 4) fixed contexts per task, TV_DRAWS
# (default 200) fresh drafts at each. Checkpointed (a draft whose file exists is skipped); one thread; about
# 4 min per draft. In the background:
#   nohup nice -n 5 experiments/regime_tv.sh > regime_tv.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
experiments/regime_lineage.sh >/dev/null
OUT=results/regimes/tv
LIST=results/regimes/drafts.tsv
mkdir -p "$OUT" .cache/regimes
export HF_HUB_OFFLINE=1
grep -v '^#' "$LIST" | while IFS=$'\t' read -r name model extra; do
  [ -z "$name" ] || [ -f "$OUT/tv-$name.jsonl" ] && continue
  echo "$(date -Is) start $name"
  # shellcheck disable=SC2086
  .venv/bin/python -m mtad.study verifiers --model "$model" --tasks gsm8k mt_bench --prompts 20 --tokens 48 \
    --stride 6 --tv-draws "${TV_DRAWS:-200}" --mtad-taus 0.1 0.3 0.5 0.7 0.9 --threads 1 $extra \
    --prompts "${TV_CONTEXTS:-4}" --tv-contexts "${TV_CONTEXTS:-4}" \
    --out "$OUT" --name "tv-$name" < /dev/null || echo "$(date -Is) FAILED $name"
  echo "$(date -Is) end $name"
done
