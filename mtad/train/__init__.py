"""Layer 3: distilling a draft for a target (depends only on models and decoding)."""
