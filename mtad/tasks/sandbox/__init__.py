"""Running untrusted completions: ``client`` (the runner's side), ``worker`` (the supervisor) and ``serve`` (the
candidate's side), the last two standard-library scripts started with ``python -I``."""
