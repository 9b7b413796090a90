"""smartcache: a session and cache service for the front servers of a mobile bank."""

__version__ = "0.1.0"
