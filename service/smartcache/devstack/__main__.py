"""`make run`: python -m smartcache.devstack (makerun.py)."""

import signal

# Blocked before make run's imports: a SIGINT that Python's default handler turned into KeyboardInterrupt
# inside importlib's module-lock callback is "ignored" there, and make run would run on deaf to it
# (makerun.main blocks them again, and takes them with sigtimedwait).
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD})

import sys  # noqa: E402 - after the signals are blocked

from smartcache.devstack.makerun import main  # noqa: E402

sys.exit(main())
