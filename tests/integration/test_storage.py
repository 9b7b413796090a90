"""The Tarantool application as the service sees it: replication, rights, restarts, operator HTTP."""

from __future__ import annotations

import json
import signal
import uuid

import httpx
import pytest
import tarantool

from smartcache.devstack.stack import Tarantool
from smartcache.wire.errors import RequestError
from smartcache.wire.sessionkeys import handle
from tests.conftest import call, connect, running_service, service_settings
from tests.helpers import eventually, metric


def test_write_on_master_is_read_on_replica_which_refuses_writes(storage_pair: tuple[Tarantool, Tarantool]) -> None:
    master, replica = storage_pair
    sid = str(uuid.uuid4())
    with connect(master) as m, connect(replica) as r:
        assert call(m, "session_create", sid, "client-repl", "5.2", 60, {"step": 1})["status"] == "OK"
        got = eventually(lambda: (res := call(r, "session_get", sid))["status"] == "OK" and res)
        assert got["client_id"] == "client-repl"
        assert got["data"] == {"step": 1}
        refused = call(r, "session_create", str(uuid.uuid4()), "client-repl", "5.2", 60, None)
        assert refused["status"] == "NOT_LEADER"


def test_service_user_may_only_execute_procedures(storage_pair: tuple[Tarantool, Tarantool]) -> None:
    master, _ = storage_pair
    with connect(master) as m:
        with pytest.raises(tarantool.DatabaseError, match="denied"):
            m.eval("return 1")
        with pytest.raises(tarantool.DatabaseError):
            m.select("sessions")
        assert call(m, "ping")["status"] == "OK"


def test_replica_reports_replication_in_stats(storage_pair: tuple[Tarantool, Tarantool]) -> None:
    master, replica = storage_pair
    with connect(replica) as r:
        stats = call(r, "stats")
    with connect(master) as m:
        at_master = call(m, "stats")["schema_version"]
    assert stats["read_only"] is True
    assert stats["schema_version"] == at_master >= 7, "the schema reached the replica by replication"
    assert stats["replication"][0]["upstream_status"] == "follow"
    coordination = {"counters", "registers", "sequences", "semaphore_holders", "latches", "queue_tasks"}
    issue_37 = {"rotations", "audit"}  # a rotated session's old ids in their grace window; the operators' audit log
    assert set(stats["spaces"]) == {"sessions", "cache", "device", "prewarm"} | coordination | issue_37


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_every_acknowledged_session_survives_a_restart(fresh_master: Tarantool, sig: signal.Signals) -> None:
    ids = [str(uuid.uuid4()) for _ in range(200)]
    with connect(fresh_master) as m:
        for i, sid in enumerate(ids):
            assert call(m, "session_create", sid, f"client-{i % 7}", "1", 600, {"n": i})["status"] == "OK"
    fresh_master.stop(sig)
    fresh_master.start()
    fresh_master.wait_ready()
    with connect(fresh_master) as m:
        found = [call(m, "session_get", sid) for sid in ids]
    assert all(r["status"] == "OK" for r in found)
    assert [r["data"]["n"] for r in found] == list(range(200))


def test_operator_http_answers_the_four_routes(storage_pair: tuple[Tarantool, Tarantool]) -> None:
    master, replica = storage_pair
    sid = str(uuid.uuid4())
    with connect(master) as m:
        call(m, "session_create", sid, "client-http", "7.0", 60, {"k": "v"})
    with httpx.Client(base_url=master.http_url, timeout=5) as h:
        health = h.get("/health")
        assert health.status_code == 200
        assert health.json()["role"] == "master"
        metrics = h.get("/metrics")
        assert metrics.status_code == 200
        assert 'smartcache_tarantool_tuples{space="sessions"}' in metrics.text
        assert "smartcache_tarantool_wal_errors_total 0" in metrics.text
        named = handle(uuid.UUID(sid).bytes)  # a session is named by its handle, never its id (issue 37)
        session = h.get(f"/sessions/{named}")
        assert session.status_code == 200
        assert session.json()["client_id"] == "client-http"
        assert session.json()["data"] == {"k": "v"}
        assert "session_id" not in session.json()
        listing = h.get("/clients/client-http/sessions")
        assert [s["handle"] for s in listing.json()["sessions"]] == [named]
        assert h.get(f"/sessions/{handle(uuid.uuid4().bytes)}").status_code == 404
        assert h.get(f"/sessions/{sid}").status_code == 400  # an id is no handle
        assert h.get("/nowhere").status_code == 404
        assert h.post("/health").status_code == 405
    with httpx.Client(base_url=replica.http_url, timeout=5) as h:
        health = h.get("/health").json()
        assert health["role"] == "replica"
        assert health["read_only"] is True
        assert health["replication"][0]["upstream_status"] == "follow"
        assert "smartcache_tarantool_replication_lag_seconds" in h.get("/metrics").text


def test_the_service_sends_writes_to_the_writable_instance_and_reads_on_when_it_is_gone(
    tmp_path, storage_pair_fresh
) -> None:
    """SMARTCACHE_TARANTOOL lists every instance; calls go to the one whose role says it may write.
    With it gone and nobody able to take over, writes fail at once and reads go on from a replica."""
    master, replica = storage_pair_fresh
    settings = service_settings(master, tarantool=(replica.address, master.address))  # order does not matter
    with running_service(settings) as r:
        c = r.client
        sid = c.session_create("client-router", data={"v": 1}).session_id
        assert metric(r.metrics_url, "smartcache_storage_leader", {"address": master.address}) == 1
        assert metric(r.metrics_url, "smartcache_storage_leader", {"address": replica.address}) == 0
        with connect(replica) as rep:  # (storage knows the session by its stored id: count it)
            eventually(lambda: call(rep, "stats")["spaces"]["sessions"] == 1, what="replicated")
        master.stop()
        eventually(lambda: metric(r.metrics_url, "smartcache_storage_leader", {"address": master.address}) == 0)
        with pytest.raises(RequestError) as e:
            c.call("SESSION_CREATE", {"client_id": "c"}, lifetime_ms=10_000, timeout_s=2)  # at once, not in 10 s
        assert e.value.transport_error == "STORAGE_UNAVAILABLE"
        got = c.session_get(sid)
        assert got.ok
        assert got.body["data"] == {"v": 1}


def test_metrics_report_upstreams_and_downstreams_apart_and_memtx(storage_pair: tuple[Tarantool, Tarantool]) -> None:
    """A master has no upstream: its follower is a downstream, never a broken upstream (a false alarm)."""
    master, replica = storage_pair
    m = httpx.get(f"{master.http_url}/metrics", timeout=5).text
    r = httpx.get(f"{replica.http_url}/metrics", timeout=5).text
    assert "smartcache_tarantool_replication_upstream_up{" not in m
    assert 'smartcache_tarantool_replication_downstream_up{peer_id="2"} 1' in m
    assert 'smartcache_tarantool_replication_upstream_up{peer_id="1"} 1' in r
    for name in ("memtx_quota_used_bytes", "memtx_quota_size_bytes", "memtx_items_used_bytes", "memtx_used_ratio"):
        assert f"smartcache_tarantool_{name} " in m, name
    for name in ("memtx_quota_mapped_ratio", "memtx_cache_bytes", "memtx_cache_budget_bytes", "memtx_cache_used_ratio"):
        assert f"smartcache_tarantool_{name} " in m, name
    assert 'smartcache_tarantool_memory_refused_total{reason="cache_budget"} 0' in m


def test_switchover_and_rejoin_are_the_operators_not_the_services(storage_pair: tuple[Tarantool, Tarantool]) -> None:
    master, _ = storage_pair
    with connect(master) as svc, pytest.raises(tarantool.DatabaseError, match="denied"):
        call(svc, "switchover", None, 1000)
    with connect(master, user="operator", password="operator") as op:
        assert call(op, "switchover", None, 1000)["status"] == "BAD_REQUEST"  # allowed; standalone has no failover
        assert call(op, "role")["role"] == "standalone"
        with pytest.raises(tarantool.DatabaseError, match="denied"):
            call(op, "session_get", str(uuid.uuid4()))  # and no customer data for operators


def test_operator_http_needs_its_token_for_customer_data_and_refuses_a_public_address_without_one(
    tmp_path,
) -> None:
    token_file = tmp_path / "http.token"
    token_file.write_text("op3rator-t0ken\n")
    t = Tarantool.create("tok", tmp_path, extra_env={"SC_HTTP_TOKEN_FILE": str(token_file)})
    t.start()
    try:
        t.wait_ready()
        sid = handle(uuid.uuid4().bytes)
        assert httpx.get(f"{t.http_url}/health", timeout=5).status_code == 200  # probes stay open
        assert httpx.get(f"{t.http_url}/sessions/{sid}", timeout=5).status_code == 401
        auth = {"Authorization": "Bearer op3rator-t0ken"}
        assert httpx.get(f"{t.http_url}/sessions/{sid}", headers=auth, timeout=5).status_code == 404
    finally:
        t.stop()
    public = Tarantool.create("pub", tmp_path, extra_env={"SC_HTTP_LISTEN": "0.0.0.0:0"})
    public.start()
    assert public.proc is not None
    assert public.proc.wait(30) != 0  # never listens: it stops before
    assert "SC_HTTP_TOKEN" in public.log_path.read_text()


def test_tarantool_logs_json_with_the_services_keys_and_starts_without_critical_lines(fresh_master: Tarantool) -> None:
    lines = [json.loads(li) for li in fresh_master.log_path.read_text().splitlines() if li.startswith("{")]
    assert len(lines) > 5
    assert all({"timestamp", "level", "event"} <= line.keys() for line in lines)
    assert all(line["level"] in ("debug", "info", "warning", "error", "critical") for line in lines)
    assert not [line["event"] for line in lines if line["level"] == "critical"]
    assert any(line["event"] == "entering the event loop" for line in lines)
