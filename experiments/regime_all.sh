#!/usr/bin/env bash
# The whole regime study from a clean checkout, in order, resumable (each step skips what it already wrote):
#   nohup experiments/regime_all.sh > regime_all.log 2>&1 &
# 1. the earlier feature-draft exports from git history (experiments/regime_lineage.sh);
# 2. held-out alpha of every draft (python -m mtad.study.alpha -> results/regimes/alpha.jsonl);
# 3. the same-draft verifier study per draft (experiments/regime_axis.sh, drafts.tsv);
# 4. the first-token TV of every draft (experiments/regime_tv.sh);
# 5. every decoder on real text with every real draft (experiments/regime_decoders.py);
# 6. the simulator check against interleaved runs (experiments/regime_check.py), CPU time;
# 7. the temperature-matched control (experiments/regime_temperature.py);
# 8. the map: python -m mtad.study.regimes.
# STEPS="alpha axis" runs only those. One thread throughout; about 4 hours on a quiet 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
STEPS="${STEPS:-alpha axis tv decoders check temperature map}"
PY=.venv/bin/python
has() { [[ " $STEPS " == *" $1 "* ]]; }
LINEAGE="${MTAD_LINEAGE_DIR:-.cache/regimes/lineage}"
experiments/regime_lineage.sh "$LINEAGE"
if has alpha; then
  echo "$(date -Is) alpha"
  $PY -m mtad.study.alpha token=models/smollm2-draft run1="$LINEAGE/run1" run3="$LINEAGE/run3" \
    run4="$LINEAGE/run4" run5=models/smollm2-feature-draft int8=target:int8 int8body=target:int8body \
    skip2=target:layers=0-13,16-29 skip1=target:layers=0-13,15-29 w4g64=target:w4g64 w4g32=target:w4g32 \
    w8g0=target:w8g0 w3g64=target:w3g64
fi
if has axis; then echo "$(date -Is) axis"; MTAD_LINEAGE_DIR="$LINEAGE" experiments/regime_axis.sh; fi
if has tv; then echo "$(date -Is) tv"; MTAD_LINEAGE_DIR="$LINEAGE" experiments/regime_tv.sh; fi
if has decoders; then
  echo "$(date -Is) decoders"
  $PY experiments/regime_decoders.py --prompts 10 --tokens 48
fi
if has check; then
  echo "$(date -Is) check"
  $PY experiments/regime_check.py --pair run5 --pair token --pair int8 --pair skip2 --pair w4g32 --prompts 10 \
    --tokens 48
fi
if has temperature && [ ! -f results/regimes/temperature/temperature.json ]; then
  echo "$(date -Is) temperature"
  $PY experiments/regime_temperature.py --prompts 30 --tokens 48 --temps 0.6 0.7 0.8 0.9
fi
if has map; then echo "$(date -Is) map"; $PY -m mtad.study.regimes; fi
echo "$(date -Is) done"
