"""Run by the launcher tests: writes its pid to a file, then waits to be stopped."""

import os
import sys
import time
from pathlib import Path

Path(sys.argv[1], f"{os.getpid()}.pid").write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
