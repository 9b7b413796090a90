"""``python -m smartcache.cli``: the same as ``smartcache-cli``."""

import sys

from smartcache.cli.main import main

sys.exit(main())
