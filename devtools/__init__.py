"""Development helpers that are not part of the service: child processes for tests and `make run`."""
