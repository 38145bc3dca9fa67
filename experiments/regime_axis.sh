#!/usr/bin/env bash
# The same-draft verifier study along the draft-strength axis, one draft after another (checkpointed: a draft
# whose rows exist is skipped; the list results/regimes/drafts.tsv is re-read after each draft, so lines can be
# appended while it runs). One thread. Run in the background:
#   nohup nice -n 5 experiments/regime_axis.sh > regime_axis.log 2>&1 &
# Settings: 20 prompts per task (GSM8K, MT-Bench), 48 tokens, a context every 6, gamma 4, T = 1, top-k 10,
# top-p 0.9; MTAD joint rule at tau 0.1/0.3/0.5/0.7/0.9; TV at 2 fixed contexts x 100 drafts (drafts.tsv turns it
# off after the first draft).
# TV=1 (experiments/regime_tv.sh) runs the first-token TV instead, for every draft: the study's fixed TV contexts
# are the first prompts' half-way points with their own seeds and draws, so `--prompts N --tv-contexts N` gives the
# full study's TV draws (the feature draft's 2 contexts x 100 draws are reproduced exactly by TV_CONTEXTS=2
# TV_DRAWS=100); TV_CONTEXTS (default 4) contexts per task, TV_DRAWS (default 200) drafts each, to results/regimes/tv.
set -uo pipefail
cd "$(dirname "$0")/.."
experiments/regime_lineage.sh >/dev/null
LIST=results/regimes/drafts.tsv
if [ "${TV:-0}" = 1 ]; then OUT=results/regimes/tv; PREFIX=tv; else OUT=results/regimes/study; PREFIX=verifier_study; fi
mkdir -p "$OUT" .cache/regimes
export HF_HUB_OFFLINE=1
while true; do
  next=$(grep -v '^#' "$LIST" | while IFS=$'\t' read -r name model extra; do
    [ -n "$name" ] && [ ! -f "$OUT/$PREFIX-$name.jsonl" ] && { printf '%s\t%s\t%s\n' "$name" "$model" "$extra"; break; }
  done)
  [ -z "$next" ] && { echo "all drafts done"; break; }
  IFS=$'\t' read -r name model extra <<< "$next"
  echo "$(date -Is) start $name ($model $extra)"
  if [ "${TV:-0}" = 1 ]; then
    n="${TV_CONTEXTS:-4}"
    more=(--prompts "$n" --tv-contexts "$n" --tv-draws "${TV_DRAWS:-200}")
  else
    more=(--save-raw ".cache/regimes/$name.pkl")
  fi
  # shellcheck disable=SC2086
  .venv/bin/python -m mtad.study verifiers --model "$model" --tasks gsm8k mt_bench --prompts 20 --tokens 48 \
    --stride 6 --tv-contexts 2 --tv-draws 100 --mtad-taus 0.1 0.3 0.5 0.7 0.9 --threads 1 \
    --out "$OUT" --name "$PREFIX-$name" $extra "${more[@]}" < /dev/null \
    || { echo "$(date -Is) FAILED $name"; grep -v '^#' "$LIST" | grep -q "^$name	" && sed -i "s/^$name\t/#failed $name\t/" "$LIST"; }
  echo "$(date -Is) end $name"
done
