#!/usr/bin/env bash
# The feature-draft lineage exports, extracted from git history for the regime study (never committed as copies):
#   experiments/regime_lineage.sh [DIR]   (default $MTAD_LINEAGE_DIR or .cache/regimes/lineage)
# writes DIR/run1, DIR/run3, DIR/run4; use them as model.draft=DIR/runN with model=smollm2_bf16_feature.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-${MTAD_LINEAGE_DIR:-.cache/regimes/lineage}}"
extract() {  # name commit path-in-repo
  local out="$DIR/$1"
  if [ -f "$out/model.safetensors" ]; then return; fi
  mkdir -p "$out"
  git archive "$2" "$3" | tar -x -C "$out" --strip-components=2
  echo "$1: $2:$3 -> $out"
}
extract run1 f59ce6a models/smollm2-feature-draft        # run 1, step 1,494 (card: held-out alpha 0.469)
extract run3 a69d499 models/smollm2-feature-draft        # run 3, step 1,521 (card: 0.540)
extract run4 0e5d2c6 models/smollm2-feature-draft-run4   # run 4, step 1,177 (card: 0.583)
