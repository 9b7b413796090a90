"""The service's metric families, one small class each: its metrics, their help text, the label
values made up front.

:class:`~smartcache.server.metrics.Metrics` is every family on one registry (it inherits them and
calls each ``_add_*`` in the order a scrape lists them), so a metric is still ``metrics.<name>``
wherever it is counted; a new metric goes in its family. Names, labels and help text are the
contract with docs/, the dashboards and the alert rules (docker/prometheus/alerts.yml): change them
there too.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from smartcache.wire import REGISTRY

PREFIX = "smartcache"
REJECTION_REASONS = ("full", "evicted", "expired", "shutting_down")
#: transport errors that mean the sender's input was malformed (the registry says which)
BAD_INPUT_ERRORS = tuple(sorted(REGISTRY.bad_input_errors))
#: fine below 10 ms, where the service lives; coarse above for outages
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: label values of the events published, by topic: what storage writes by itself, and app for application topics
EVENT_TOPIC_LABELS = (
    "session.created",
    "session.updated",
    "session.deleted",
    "session.expired",
    "session.rotated",
    "session.evicted",
    "device.bound",
    "products.stored",
    "bucket.sent",
    "bucket.received",
    "app",
)


def label(name: str) -> str:
    """A label value: the one case for every value (registry names are upper case)."""
    return name.lower()


class MessageMetrics:
    """Messages, the queue and the workers."""

    def _add_message_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Messages answered and how long they took; the queue and the worker pool (broker/, work/)."""
        self.messages = Counter(
            f"{p}_messages_total",
            "Messages answered or finished, by type and outcome.",
            ["type", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            f"{p}_request_duration_seconds",
            "From arrival to reply sent (queue wait included), by type.",
            ["type"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_depth = Gauge(f"{p}_queue_depth", "Messages waiting in the queue.", registry=r)
        self.queue_capacity = Gauge(f"{p}_queue_capacity", "Queue capacity.", registry=r)
        self.rejections = Counter(
            f"{p}_queue_rejections_total",
            "Messages refused or dropped by the queue, by reason.",
            ["reason"],
            registry=r,
        )
        self.workers = Gauge(f"{p}_workers", "Worker slots in the pool.", registry=r)
        self.workers_busy = Gauge(f"{p}_workers_busy", "Worker slots busy with a message.", registry=r)
        self.workers_busy_by_type = Gauge(
            f"{p}_workers_busy_by_type", "Busy worker slots, by message type.", ["type"], registry=r
        )
        self.bulkhead_limit = Gauge(
            f"{p}_bulkhead_limit", "Most worker slots one message type may occupy.", ["type"], registry=r
        )
        for name in REGISTRY.types:
            self.duration.labels(label(name))
            self.workers_busy_by_type.labels(label(name))
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)


class StorageMetrics:
    """Storage: the calls and the instances they go to."""

    def _add_storage_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Stored procedure calls and the Tarantool instances they go to (storage/)."""
        self.storage_calls = Counter(
            f"{p}_storage_calls_total",
            "Stored procedure calls, by procedure and outcome.",
            ["procedure", "outcome"],
            registry=r,
        )
        self.storage_latency = Histogram(
            f"{p}_storage_call_duration_seconds",
            "Stored procedure call latency.",
            ["procedure"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.storage_connected = Gauge(
            f"{p}_storage_connected",
            "1 per worker thread connected to its Tarantool instance, by address.",
            ["address"],
            registry=r,
        )
        self.storage_state_changes = Counter(
            f"{p}_storage_state_changes_total",
            "Storage instance state changes seen by a worker (up, stalled: pings unanswered, down).",
            ["address", "state"],
            registry=r,
        )
        self.storage_clock_offset = Gauge(
            f"{p}_storage_clock_offset_seconds",
            "The instance's wall clock minus the service's, measured by pings (deadlines are sent on its clock).",
            ["address"],
            registry=r,
        )
        self.storage_write_failures = Counter(
            f"{p}_storage_write_failures_total",
            "Writes storage failed, by reason: refused without effect (not_leader, read_only, disk, out_of_memory), "
            "or rolled back with the outcome unknown (sync_quorum_timeout, sync_rollback).",
            ["reason"],
            registry=r,
        )
        self.storage_leader = Gauge(
            f"{p}_storage_leader",
            "1 for the Tarantool instance the service sends calls to (the one that may write), by address.",
            ["address"],
            registry=r,
        )
        self.storage_instances = Gauge(
            f"{p}_storage_instances",
            "Tarantool instances the service knows (SMARTCACHE_TARANTOOL, or discovered in etcd).",
            registry=r,
        )
        self.storage_discovery_changes = Counter(
            f"{p}_storage_discovery_changes_total",
            "Instances discovery added (a new member in etcd) or removed (gone from the topology), by change.",
            ["change"],
            registry=r,
        )
        self.storage_discovery_errors = Counter(
            f"{p}_storage_discovery_errors_total",
            "Reads of the members in etcd that failed (no member answered, unreadable topology): instances kept.",
            registry=r,
        )


class RoutingMetrics:
    """Storage: who leads, and a sharded cluster's routing."""

    def _add_routing_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Which leader the service writes to, and a sharded cluster's routing (docs/design/sharding.md)."""
        self.storage_leader_changes = Counter(
            f"{p}_storage_leader_changes_total", "Times the service found another (or its first) leader.", registry=r
        )
        self.storage_leader_term = Gauge(
            f"{p}_storage_leader_term",
            "The current leader's term: counted in the leader key, one more per leader change, never going back "
            "(also across an etcd restore or wipe); 0 without failover.",
            registry=r,
        )
        self.storage_wrong_bucket = Counter(
            f"{p}_storage_wrong_bucket_total",
            "Calls a shard refused with WRONG_BUCKET (nothing done: the map was read again and the call sent again).",
            ["shard"],
            registry=r,
        )
        self.storage_bucket_moving = Counter(
            f"{p}_storage_bucket_moving_total",
            "Calls a shard answered BUCKET_MOVING (their bucket paused while it moves; nothing done: sent again).",
            ["shard"],
            registry=r,
        )
        self.buckets_active = Gauge(
            f"{p}_buckets_active",
            "Buckets a shard serves (active there), as its leader said at the settler's last pass (every 5 s).",
            ["shard"],
            registry=r,
        )
        self.buckets_moving = Gauge(
            f"{p}_buckets_moving",
            "Buckets of a shard between states of a move (sending, sent, receiving, garbage) at the settler's last "
            "pass: 0 when no move is under way; one that stays above 0 is a move the settler could not settle.",
            ["shard"],
            registry=r,
        )
        self.storage_bucket_map_version = Gauge(
            f"{p}_storage_bucket_map_version",
            "The version of the bucket map the service routes by (0: one replica set, not sharded).",
            registry=r,
        )


class FailureMetrics:
    """What was refused, malformed or lost, at the door or inside (and the keys the door allows)."""

    def _add_failure_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Clients refused (CURVE) and the keys allowed, bad input, slots the watchdog took back, INTERNAL
        answers and replies that could not be delivered."""
        self.auth_failures = Counter(
            f"{p}_auth_failures_total",
            "Clients refused before any frame was processed, by reason (unknown_key, handshake).",
            ["reason"],
            registry=r,
        )
        self.auth_keys = Gauge(f"{p}_auth_keys", "Client keys allowed now (CURVE).", registry=r)
        self.session_not_found = Counter(
            f"{p}_session_not_found_total",
            "Answers saying a session is not live (NOT_FOUND of a request naming one): guesses show here first.",
            registry=r,
        )
        self.session_not_found_throttled = Counter(
            f"{p}_session_not_found_throttled_total",
            "Requests naming a session refused QUEUE_FULL, not executed: their peer had"
            " SMARTCACHE_NOT_FOUND_PER_PEER_PER_S such answers in its second (guessing, PROTOCOL.md 4).",
            registry=r,
        )
        self.bad_input_throttled = Counter(
            f"{p}_bad_input_throttled_total",
            "Malformed messages dropped unanswered: over the per-connection or global rate of answers.",
            registry=r,
        )
        self.watchdog_reclaimed = Counter(
            f"{p}_watchdog_reclaimed_total",
            "Worker slots the broker took back past their message's deadline + grace (a bug if not 0).",
            registry=r,
        )
        self.internal_errors = Counter(
            f"{p}_internal_errors_total", "Messages answered INTERNAL (each logged with its error id).", registry=r
        )
        self.bad_input = Counter(
            f"{p}_bad_input_total", "Malformed messages, by transport error.", ["error"], registry=r
        )
        self.dropped_replies = Counter(
            f"{p}_dropped_replies_total", "Replies that could not be delivered, by reason.", ["reason"], registry=r
        )
        for error in BAD_INPUT_ERRORS:
            self.bad_input.labels(label(error))


class HandlerMetrics:
    """What the handlers count, by outcome."""

    def _add_handler_metrics(self, r: CollectorRegistry, p: str) -> None:
        """What the handlers count: prewarm fetches, PRODUCTS_GET answers, the coordination primitives."""
        self.prewarm = Counter(f"{p}_prewarm_total", "Prewarm fetches, by outcome.", ["outcome"], registry=r)
        self.products = Counter(f"{p}_products_total", "PRODUCTS_GET answers, by source.", ["source"], registry=r)
        self.coordination_operations = Counter(
            f"{p}_coordination_operations_total",
            "Coordination calls answered by storage, by primitive (counter, register, sequence, semaphore, latch,"
            " queue) and status.",
            ["primitive", "outcome"],
            registry=r,
        )
        self.coordination_waiters = Gauge(
            f"{p}_coordination_waiters",
            "Calls of this service waiting inside storage now (acquire, latch await, queue take), by primitive.",
            ["primitive"],
            registry=r,
        )
        self.coordination_lost = Counter(
            f"{p}_coordination_lost_total",
            "Holders told they lost what they held: a semaphore lease that had passed (renew), a task taken again"
            " after its time-to-run (ack, release), by primitive.",
            ["primitive"],
            registry=r,
        )
        self.sessions_rekeyed = Counter(
            f"{p}_sessions_rekeyed_total",
            "Sessions stored by their raw id that a call renamed to their stored id (SMARTCACHE_SESSION_REKEY=lazy).",
            registry=r,
        )
        for outcome in ("started", "skipped_fresh", "skipped_busy", "completed", "failed"):
            self.prewarm.labels(outcome)
        for source in ("cache", "waited", "fetched", "error"):
            self.products.labels(source)
        for primitive in ("counter", "register", "sequence", "semaphore", "latch", "queue"):
            self.coordination_waiters.labels(primitive)
        for primitive in ("semaphore", "queue"):
            self.coordination_lost.labels(primitive)


class EventMetrics:
    """The event log and its publisher."""

    def _add_event_metrics(self, r: CollectorRegistry, p: str) -> None:
        """The event log's (issue 16): the publisher (service/smartcache/server/publisher.py) and EVENTS_READ waits."""
        self.events_published = Counter(
            f"{p}_events_published_total",
            "Events of the log published on the events PUB socket (each is written, committed, once), by topic"
            " (application topics as app).",
            ["topic"],
            registry=r,
        )
        self.events_head_seq = Gauge(
            f"{p}_events_head_seq", "Newest event sequence the reader has seen committed.", ["shard"], registry=r
        )
        self.events_published_seq = Gauge(
            f"{p}_events_published_seq", "Newest event sequence published on the PUB socket.", ["shard"], registry=r
        )
        self.events_oldest_seq = Gauge(
            f"{p}_events_oldest_seq", "Oldest event sequence storage still keeps (retention).", ["shard"], registry=r
        )
        self.events_partitions = Gauge(
            f"{p}_events_partitions", "Day partitions of the event log.", ["shard"], registry=r
        )
        self.events_reader_lag = Gauge(
            f"{p}_events_reader_lag_events",
            "Committed events the reader has not published yet (head minus published, after each read).",
            ["shard"],
            registry=r,
        )
        self.events_delay = Histogram(
            f"{p}_events_publish_delay_seconds",
            "From an event's time in storage (its transaction) to its publication on the PUB socket: one sample"
            " per batch read, its oldest event's.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.events_subscribers = Gauge(
            f"{p}_events_subscribers", "Connections to the events PUB socket now.", registry=r
        )
        self.events_readers_waiting = Gauge(
            f"{p}_events_readers_waiting",
            "EVENTS_READ messages of this service waiting inside storage for a commit now.",
            registry=r,
        )
        for topic in EVENT_TOPIC_LABELS:
            self.events_published.labels(topic)


class BackendMetrics:
    """The core backend."""

    def _add_backend_metrics(self, r: CollectorRegistry, p: str) -> None:
        """The core backend's HTTP calls (corebackend.py)."""
        self.backend_calls = Counter(
            f"{p}_backend_calls_total",
            "Core backend HTTP calls, by data type and outcome.",
            ["data_type", "outcome"],
            registry=r,
        )
        self.backend_latency = Histogram(
            f"{p}_backend_call_duration_seconds",
            "Core backend call latency.",
            ["data_type"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
