"""Fixtures of the flow tests: the GeoLife sample preprocessed once per session is ``preprocessed_copy``,
in tests/conftest.py (the browser tests use it too)."""
