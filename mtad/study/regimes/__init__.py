"""The regime map: MTAD against token-wise speculative decoding and block verification along the draft-strength
axis, hardware-free (accepted lengths of the same-draft study) and in time (measured here, simulated here,
projected under declared GPU profiles).

``python -m mtad.study.regimes`` reads what the regime runs wrote under ``results/regimes/``
(:mod:`~mtad.study.regimes.inputs`): ``drafts.tsv``, ``alpha.jsonl`` (held-out α per draft with its per-prompt
counts, :mod:`mtad.study.alpha`), the per-context records ``study/<draft>.contexts.json`` and the simulator
checks ``check/check-<draft>.json`` (``experiments/regime_check.py``); builds the map
(:mod:`~mtad.study.regimes.build`) and writes ``regimes.md`` (:mod:`~mtad.study.regimes.tables`),
``regimes.json`` and ``regimes.png`` (:mod:`~mtad.study.regimes.figure`) there.

**[choice]** The study's MTAD row is MTAD's joint rule on a chain-sampled draft (:mod:`mtad.study.verifiers`);
the timed ``mtad`` decoder proposes by beam sampling, so its measured accepted length differs. The simulator's
curves use the study's histograms with MTAD's beam-drafting cost; the measured points use the decoder itself.
"""
