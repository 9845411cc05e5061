"""python -m ember.launch: the same as the ember-run command."""

import sys

from ember.launch.cli import main

sys.exit(main())
