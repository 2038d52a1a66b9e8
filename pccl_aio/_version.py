"""The one place the version lives (read by setuptools' dynamic metadata)."""

from typing import Final

__version__: Final = "0.1.0.dev0"
