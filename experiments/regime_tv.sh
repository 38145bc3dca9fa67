#!/usr/bin/env bash
# The first-token total variation to the target's law for every draft of the axis (results/regimes/drafts.tsv), the
# TV mode of experiments/regime_axis.sh (see there). Checkpointed; one thread; about 4 min per small draft, 10 per
# draft of the target's size. In the background:
#   nohup nice -n 5 experiments/regime_tv.sh > regime_tv.log 2>&1 &
TV=1 exec "$(dirname "$0")/regime_axis.sh"
