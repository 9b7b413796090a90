"""Storage: stored procedure calls to the Tarantool instance that may write.

:mod:`.routing` (:class:`Storage`, what handlers call: the call, sent again where its
outcome allows), :mod:`.leadership` (which instance leads, where a call goes while none
does), :mod:`.outcomes` (what a failed call means), :mod:`.membership` (which instances:
the static list, then etcd's members), :mod:`.instances` (one connection each, kept alive
and watched), :mod:`.clock` (each instance's clock offset), :mod:`.shards` (which shard a
call goes to, when the cluster is sharded). Only stored procedures are called
(lua/smartcache/api.lua), never spaces.
"""

from smartcache.server.storage.routing import Storage
from smartcache.server.storage.shards import ShardRouter

#: what a worker and its handlers hold: one replica set's Storage, or the router over the shards
AnyStorage = Storage | ShardRouter

__all__ = ["AnyStorage", "ShardRouter", "Storage"]
