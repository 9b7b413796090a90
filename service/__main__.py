"""``python -m service``: see service.app."""

import sys

from service.app import main

sys.exit(main())
