"""Layer 4: statistics over result rows and the tables built from them."""
