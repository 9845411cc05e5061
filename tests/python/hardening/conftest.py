"""The property suite imports its shared strategies as ``fuzz`` (this folder on sys.path)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
