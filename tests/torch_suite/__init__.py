"""PyTorch's own ``distributed_test.py`` run against a backend (``spawn_suite.py``)."""
