"""Layer 4: statistics over result rows (stats), the derived frame (frame), the paper's claims (claims) and the
tables built from them (render)."""
