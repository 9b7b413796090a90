"""The --processes parent's one metrics view: every child's families once, each sample labelled by process."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smartcache.server.metrics import Metrics
from smartcache.server.metrics_union import exposition, union


def child_text(pings: int, duration_s: float) -> str:
    m = Metrics()
    m.messages.labels("ping", "ok").inc(pings)
    m.duration.labels("ping").observe(duration_s)
    return generate_latest(m.registry).decode()


def merged() -> str:
    return exposition(union({"0": child_text(3, 0.001), "1": child_text(4, 0.2)})).decode()


def test_each_family_has_one_help_and_one_type_line() -> None:
    lines = merged().splitlines()
    for kind in ("# HELP ", "# TYPE "):
        names = [line.split()[2] for line in lines if line.startswith(kind)]
        assert len(names) == len(set(names)), kind
    assert "# TYPE smartcache_messages_total counter" in lines
    assert "# TYPE smartcache_request_duration_seconds histogram" in lines


def test_every_sample_carries_its_process_and_the_counts_add_up() -> None:
    families = {f.name: f for f in text_string_to_metric_families(merged())}
    pings = {
        s.labels["process"]: s.value
        for s in families["smartcache_messages"].samples
        if s.labels.get("type") == "ping" and s.name.endswith("_total")
    }
    assert pings == {"0": 3.0, "1": 4.0}
    counts = {
        s.labels["process"]: s.value
        for s in families["smartcache_request_duration_seconds"].samples
        if s.name.endswith("_count") and s.labels["type"] == "ping"
    }
    assert counts == {"0": 1.0, "1": 1.0}
    assert all("process" in s.labels for f in families.values() for s in f.samples)


def test_a_family_whose_type_differs_keeps_the_first_processs_type_and_samples() -> None:
    first = "# HELP x_things Things.\n# TYPE x_things gauge\nx_things 1.0\n"
    second = "# HELP x_things_total Things.\n# TYPE x_things_total counter\nx_things_total 2.0\n"
    (family,) = union({"0": first, "1": second})
    assert family.type == "gauge"
    assert [(s.labels, s.value) for s in family.samples] == [({"process": "0"}, 1.0)]


def test_no_children_is_an_empty_exposition() -> None:
    assert exposition(union({})) == b""
