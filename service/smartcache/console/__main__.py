"""``python -m smartcache.console``."""

from smartcache.console.main import main

raise SystemExit(main())
