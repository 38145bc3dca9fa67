"""Forecasts: every decoder at any setting on any hardware, from hardware-free acceptance and a cost profile.

A forecast never times the decoder it predicts. It multiplies two things measured apart:

- **acceptance** (:mod:`.replay`): the decoder itself decodes a task's held-out prompts with fixed seeds and
  records, per prompt, its accepted lengths and every forward shape it ran (``DecodeResult.calls``): hardware-free
  figures, cached by (pair, decoder settings, prompts, seeds, tokens);
- **a cost profile** (:mod:`.costs`): what one forward of each shape costs and the harness time outside forwards,
  calibrated once per machine by its own command on prompts of its own (:func:`.costs.calibrate`), or declared
  for a GPU with the basis of every term (:mod:`.declared`).

:mod:`.predict` turns them into ms/token and speed-ups with bootstrap intervals over the prompts;
``python -m mtad.study.forecast`` is the command (docs/RUNNING.md, "Forecasts").
"""
