"""The graph tests import their shared helpers as ``graphs`` (this folder on sys.path)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
