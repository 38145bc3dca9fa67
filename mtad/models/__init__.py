"""Layer 2: model pairs (hub, local, tiny random, the embedded SmolLM2), draft heads, feature drafts, int8."""
