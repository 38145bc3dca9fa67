"""Layer 0: helpers every layer may use (paths, strict config building, atomic writes, the version)."""
