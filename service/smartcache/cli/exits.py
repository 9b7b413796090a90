"""smartcache-cli's exit codes: one per kind of outcome, the same for every command.

A script tells from the code alone whether to fix its command line (2), wait and try again
(3, 4), install something (5) or read the answer (1). Before, 2 meant a usage error, a
timeout and a transport error at once (issue 36: a newcomer could not tell a typo from a
service that was down). 2 stays argparse's usage error; the others are new numbers rather
than sysexits' 64-78, which no other program of the house uses (Tarantool's 75 aside).
:data:`HELP` is the text of ``smartcache-cli --help``'s epilog, and docs/operations.md
lists the same table.
"""

from __future__ import annotations

#: an OK answer (cluster status: healthy)
OK = 0
#: an answer that is not OK: NOT_FOUND, CONFLICT, LIMIT_REACHED...; cluster status not healthy, an operation
#: refused or not done (NO_LEADER, MOVE_FAILED...); events after --from dropped (CURSOR_TOO_OLD)
STATUS = 1
#: the command cannot be run as given: a bad argument, option or environment variable (BAD_ARGUMENT), or it
#: names a cluster, shard or instance that does not exist (NOT_FOUND); nothing was sent
USAGE = 2
#: no answer within --timeout (TIMEOUT): the request may or may not have run
TIMEOUT = 3
#: the service answered a transport error (QUEUE_FULL, STORAGE_UNAVAILABLE...), etcd or the instances did not
#: answer (ETCD_UNAVAILABLE, UNREACHABLE), or an instance stopped answering during an operation (CONNECTION_LOST)
UNAVAILABLE = 4
#: a package the command needs is not installed (MISSING_PACKAGE: cluster needs the server extra)
MISSING_PACKAGE = 5

HELP = f"""Exit codes (the same for every command):
  {OK}  an OK answer (cluster status: healthy)
  {STATUS}  an answer that is not OK (NOT_FOUND, CONFLICT...; cluster status not healthy;
     an operation refused or not done; events tail: CURSOR_TOO_OLD)
  {USAGE}  the command cannot be run as given: a bad argument or environment variable
     (BAD_ARGUMENT), or a cluster, shard or instance that does not exist (NOT_FOUND)
  {TIMEOUT}  no answer within --timeout (TIMEOUT): the request may or may not have run
  {UNAVAILABLE}  a transport error (QUEUE_FULL, STORAGE_UNAVAILABLE...), etcd or the instances
     not answering (ETCD_UNAVAILABLE, UNREACHABLE), or an instance lost during an
     operation (CONNECTION_LOST): try again later
  {MISSING_PACKAGE}  a package is missing (MISSING_PACKAGE: cluster needs the server extra)"""
