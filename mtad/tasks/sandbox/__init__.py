"""Running untrusted completions: ``client`` (the runner's side), ``worker`` (the supervisor), ``reply`` (the
supervisor's reading of the candidate's replies) and ``serve`` (the candidate's side and the wire format);
the last three are standard-library scripts, ``worker`` and ``serve`` started with ``python -I``."""
