"""The package version, below every layer so that result rows can record it."""
__version__ = "0.1.0"
