"""What several test modules share (no tests here): the app's helpers (app.py), shared stores (stores.py) and
fp64 references written from the formulas (reference.py). Fixtures are in tests/conftest.py."""
