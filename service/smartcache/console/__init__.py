"""The operator's console: the cluster at a glance in a browser (``smartcache-console``).

``python -m smartcache.console`` runs it too.

Its own small process, not a page of the service: it reads what ``smartcache-cli``
reads (etcd, every Tarantool instance, every service instance's INFO and
``/metrics``), so it must not live inside one service instance whose failure
would blank the page; it runs beside the cluster with the operator's
credentials. It imports the operations library (smartcache.ops), the client and
the wire, never the server or the CLI (import-linter contracts in pyproject.toml).

* ``main``: the command, or what is missing when the server extra is not installed;
* ``serve``: start-up, the log, exit codes;
* ``settings``: the command line and the environment, the token, production's refusal;
* ``parts``: one poller per part (the storage cluster, each service's INFO), blocking calls in
  an executor with a bounded wait, so one part that does not answer degrades only itself;
* ``rates``: each service's ``/metrics`` scraped into a bounded ring, the derived series;
* ``sessions``: lookups by client id or handle (never by session id), from the instances' operator
  HTTP, data masked unless revealed;
* ``events``: the event tail; ``audit``: the audit panel (the operator actions storage recorded);
* ``actions``: switchover, rejoin, reveal, log out everywhere: each with a reason, audited;
* ``app``: the aiohttp routes, the token check of the actions, the static page.
"""
