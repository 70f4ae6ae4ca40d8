"""Tram's version, in a leaf module: the server reports it without importing the `tram` package's
public names (which sit above every floor). pyproject.toml states the same number for packaging."""

from __future__ import annotations

__version__ = "0.1.0"
