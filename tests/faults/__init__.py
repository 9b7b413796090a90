"""The fault suite (issue 12): real processes, real faults, histories checked. `make test-faults`.

Not collected by `make test` (no test_*.py here); the checkers' own tests are
selftest_*.py, run by `make test-faults` first.
"""
