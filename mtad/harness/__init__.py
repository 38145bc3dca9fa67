"""Layer 5: configs, the one runner, run folders, result rows and their store, sweeps, tracking, lm-eval."""
