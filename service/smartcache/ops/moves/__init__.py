"""Moving buckets between shards: one bucket's move, the settling of moves left half-done, and plans.

docs/design/resharding.md is the design and docs/storage-sharding.md ("Moving a bucket")
the states and transitions, each a compare-and-set that storage checks
(lua/smartcache/sharding/moves.lua; the transitions as data in sharding/transitions.lua).
This package only drives them, in the order that keeps
a bucket active on at most one shard:

1. source ``send_start`` (active -> sending, generation + 1: the bucket's calls are
   answered BUCKET_MOVING from now on);
2. destination ``recv_start`` (receiving at that generation);
3. the rows, space by space, page by page (``bucket_rows`` -> ``bucket_recv``; each
   chunk one synchronous transaction on the destination);
4. source ``send_done`` (sending -> sent: calls answered WRONG_BUCKET naming the
   destination);
5. destination ``recv_done`` (receiving -> active: served there);
6. the bucket map in etcd, by compare-and-swap on its revision;
7. source ``gc`` (its copy deleted in batches, then its row).

A leader lost mid-move (killed, frozen, cut off) is ridden out: each call goes to the
leader the shard's leader key names, one left unanswered is dropped once the key names
another (:class:`~.link.Link`), and the new leader finds the move where the old one left it, so
the bucket's pause grows by about a failover. A failure before 4 that outlasts that
(LEADER_WAIT_S, or a step refused) gives the move up (source ``send_abort``: active again
at a higher generation, so the destination's partial copy can never be made active;
destination ``recv_abort``). After 4 the move can only go forward. :func:`~.settler.settle` finishes or
gives up what a driver left (a killed CLI, a leader change, a partition), and every
service instance runs it every few seconds (the ``Settler``), so no move needs a
person to end. Any number of drivers may act on one bucket at once: each transition
is checked by storage against the bucket's status and generation.

The rooms, each importing only those above it:

* :mod:`.errors`: MoveError, NotSharded, the check of a step's answer;
* :mod:`.bucketmap`: the map in etcd, read and changed by compare-and-swap;
* :mod:`.link`: a shard's leader, found by its key and watched while a call goes unanswered;
* :mod:`.engine`: one move, a move given up, many at once (rebalance, drain);
* :mod:`.plan`: which buckets go where (even by count), a shard that joins empty;
* :mod:`.settler`: one settle pass, and the thread every service instance runs it in;
* :mod:`.commands`: the operator's commands (one move, rebalance, drain, a settle pass), each
  written to the audit (:mod:`smartcache.ops.audit`).
"""

from smartcache.ops.moves import commands
from smartcache.ops.moves.bucketmap import assign, change_map, owners, ranges_of, read_map
from smartcache.ops.moves.engine import CHUNK, SPACES, Moved, Progress, give_up, move, run_moves
from smartcache.ops.moves.errors import MoveError, NotSharded
from smartcache.ops.moves.link import ANSWER_TIMEOUT_S, LEADER_WAIT_S, Link, Links
from smartcache.ops.moves.plan import plan_even, shard_add
from smartcache.ops.moves.settler import STALL_S, Settler, settle

__all__ = [
    "ANSWER_TIMEOUT_S",
    "CHUNK",
    "LEADER_WAIT_S",
    "SPACES",
    "STALL_S",
    "Link",
    "Links",
    "MoveError",
    "Moved",
    "NotSharded",
    "Progress",
    "Settler",
    "assign",
    "change_map",
    "commands",
    "give_up",
    "move",
    "owners",
    "plan_even",
    "ranges_of",
    "read_map",
    "run_moves",
    "settle",
    "shard_add",
]
