"""make run's local stack, from a checkout (not part of the installed package): etcd, the Tarantool
instances, the simulated core backend, the service and the console as child processes on 127.0.0.1,
supervised in the foreground (smartcache.supervision, the one supervisor). Tests start parts of it too
(free ports, children stopped by PID): stack.py is what they import."""
