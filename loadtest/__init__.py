"""smartcache load generator, benchmark and simulated core backend."""
