"""``spawn_suite.py`` is collected only when ``BACKEND`` is set (``BACKEND=gloo`` or
``BACKEND=pccl_aio``): torch's ``distributed_test.py`` reads it at import, and a run of the
whole file takes far longer than the rest of the suite. ``python -m pytest`` without it skips
this folder (its file name does not match ``test_*.py`` either)."""

import os

collect_ignore = [] if os.environ.get("BACKEND") else ["spawn_suite.py"]
