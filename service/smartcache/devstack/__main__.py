"""`make run`: python -m smartcache.devstack (the module stack.py, imported once: etcd.py imports it too)."""

import sys

from smartcache.devstack.stack import main

sys.exit(main())
