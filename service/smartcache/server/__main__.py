"""``python -m smartcache.server``: the service in the foreground (see smartcache.server.app)."""

import sys

from smartcache.server import main

sys.exit(main())
