"""One metrics view per host: the union of the ``--processes`` children's ``/metrics``.

Each child serves its own registry on a private port; the parent scrapes them all on every scrape
of its own port and answers one exposition in which every family appears once (one HELP, one TYPE)
with every child's samples, each labelled ``process="<index>"``. The children's texts are parsed
with prometheus_client's parser and written again by its own ``generate_latest``, so names, escapes
and the ``_total`` of counters come out exactly as a single process writes them. A family whose
type differs between children (two versions side by side in a rollout) keeps the first child's
type and drops the other's samples: a family has one type.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

#: the label every child's sample gets
PROCESS_LABEL = "process"


def union(texts: Mapping[str, str], label: str = PROCESS_LABEL) -> list[Metric]:
    """The families of every text (label value -> exposition text), each once, in order of first sight,
    with each sample labelled by its text's key."""
    families: dict[str, Metric] = {}
    for value, text in texts.items():
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
            elif merged.type != family.type:
                continue
            merged.samples.extend(s._replace(labels={**s.labels, label: value}) for s in family.samples)
    return list(families.values())


def exposition(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format of these families (HELP and TYPE once each)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families)))
    return generate_latest(registry)


class _Fixed(Collector):
    """Families collected once already."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
