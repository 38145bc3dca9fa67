"""Layer 3: measuring a decode (metrics, energy), what a forward costs (cost model) and agreement studies."""
