"""The operator's console (issue 29) against a real stack, through a real headless Chromium.

One stack for the module: etcd (three members) and three Tarantool instances in
HA mode (conftest_ha), the real service as a child process over them, and
``python -m smartcache.console`` as a child process whose log is kept and read
at the end. Chromium (Debian's, driven by Selenium through chromedriver) opens
the page; the tests poll the DOM for what it shows. The tests run in file order
on the one stack: the kill of the leader comes last but one, the log check last.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from smartcache.client import Client
from smartcache.console.app import ACTION_ROUTES, make_app
from smartcache.console.settings import from_args
from smartcache.devstack.stack import free_port
from tests.conftest import ServiceProcess, service_process
from tests.integration.conftest_ha import TTL_S, HACluster, eventually, ha_cluster, wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "console-test-token-" + uuid.uuid4().hex  # a test's own token, looked for in logs and pages
SECRET_DATA = "secret-value-" + uuid.uuid4().hex
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="Debian's chromium and chromium-driver are not installed (make sysdeps installs them)",
)


@dataclass
class Stack:
    ha: HACluster
    service: ServiceProcess
    console: subprocess.Popen[bytes]
    url: str
    log_path: Path
    browser: WebDriver

    def api(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10)

    def text(self, element_id: str) -> str:
        return str(self.browser.find_element(By.ID, element_id).text)

    def address(self, name: str) -> str:
        return self.ha.nodes[name].address

    def shows(self, condition: Callable[[], object], timeout_s: float, what: str) -> None:
        """Poll the page until condition() holds (an element may be redrawn between two reads: asked again)."""

        def holds() -> object:
            try:
                return condition()
            except Exception:  # StaleElementReference and the like: the next poll reads the new DOM
                return False

        eventually(holds, timeout_s, interval_s=0.1, what=what)


@contextlib.contextmanager
def _console(
    ha: HACluster, svc: ServiceProcess, events_port: int, base: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    port = free_port()
    log_path = base / "console.log"
    env = {**os.environ, "SMARTCACHE_CONSOLE_TOKEN": TOKEN}
    env.pop("SMARTCACHE_METRICS_TOKEN", None)
    argv = [
        sys.executable, "-m", "smartcache.console",
        "--listen", f"127.0.0.1:{port}",
        "--tarantool", ",".join(n.address for n in ha.nodes.values()),
        "--etcd", ha.etcd.url,
        "--service", f"{svc.endpoint}=http://127.0.0.1:{svc.metrics_port}",
        "--publishers", f"tcp://127.0.0.1:{events_port}",
        "--scrape-s", "1",
        "--timeout", "1",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, f"http://127.0.0.1:{port}", log_path
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


@contextlib.contextmanager
def _browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,1100",
    ):
        options.add_argument(arg)
    # chromedriver on a free 127.0.0.1 port, given by path (no Selenium Manager download); quit() stops it
    driver = webdriver.Chrome(options=options, service=ChromeService(CHROMEDRIVER, port=free_port()))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("console")
    with ha_cluster(base) as ha:
        addresses = ",".join(n.address for n in ha.nodes.values())
        events_port = free_port()
        with (
            service_process(
                ha.nodes["ha1"],
                base,
                SMARTCACHE_TARANTOOL=addresses,
                SMARTCACHE_EVENTS_LISTEN=f"tcp://127.0.0.1:{events_port}",
            ) as svc,
            _console(ha, svc, events_port, base) as (proc, url, log_path),
            _browser() as browser,
        ):
            s = Stack(ha, svc, proc, url, log_path, browser)
            wait_for(lambda: _leader_of(s), 30, 0.2, what="the console sees a leader")
            browser.get(url + "/")
            yield s


def _leader_of(s: Stack) -> str | None:
    try:
        leader: str | None = s.api("/api/status").json().get("leader")
    except httpx.HTTPError:
        return None
    return leader


def _screenshot(s: Stack, name: str) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    s.browser.save_screenshot(str(IMG / name))


def _assert_nothing_secret_on_page(s: Stack) -> None:
    page = s.browser.page_source
    assert TOKEN not in page
    assert SECRET_DATA not in page


def test_the_page_shows_the_elected_leader(stack: Stack) -> None:
    leader = stack.address(stack.ha.leader())
    stack.shows(lambda: stack.text("leader") == leader, 15, f"the page names {leader} the leader")
    row = stack.browser.find_element(By.CSS_SELECTOR, f'tr[data-address="{leader}"] .role')
    assert row.text == "leader"
    # some traffic, so that the charts and the events have something to show in the screenshot
    with Client(stack.service.endpoint, timeout_s=5) as c:
        for n in range(30):
            assert c.session_create("client-console-warm", data={"n": n}).ok
    stack.shows(lambda: stack.browser.find_elements(By.CSS_SELECTOR, "#events tr"), 15, "events listed")
    stack.shows(lambda: "points" in stack.text("rates-note"), 15, "the charts have points")
    stack.shows(lambda: stack.text("health") == "healthy", 15, "healthy")
    _screenshot(stack, "console-healthy.png")


#: raw Tarantool error text as a follower reports it when its upstream breaks (issue 36: it overflowed the table)
RAW_ERROR = (
    "replication from the leader disconnected for 1 s: unexpected EOF when reading from socket, called on fd 18, "
    "aka 127.0.0.1:55932, peer of 127.0.0.1:23093; "
) * 4

_DRAW_LONG_PROBLEM = """
const status = {instances: [
  {name: "long-1", address: "127.0.0.1:1", reachable: true, role: "leader", writable: true, term: 2,
   vclock: {1: 5}, lease_left_ms: 2000},
  {name: "long-2", address: "127.0.0.1:2", reachable: true, role: "follower", term: 2, vclock: {1: 5},
   upstream_problem: arguments[0]},
]};
const box = document.createElement("div");
box.id = "long-problem";
box.append(topologyTable(status, [], null));
const section = document.getElementById("topology-section");
section.append(box);
const clip = box.querySelector("td.problem .clip");
const out = {
  sectionRight: section.getBoundingClientRect().right,
  buttonRight: box.querySelector("button.rejoin").getBoundingClientRect().right,
  overflows: section.scrollWidth > section.clientWidth,
  title: clip.title,
  cut: clip.scrollWidth > clip.clientWidth,
};
box.remove();
return out;
"""


def _section_overflows(s: Stack) -> bool:
    return bool(s.browser.execute_script(
        "const e = document.getElementById('topology-section'); return e.scrollWidth > e.clientWidth;"
    ))  # fmt: skip


def test_raw_error_text_is_cut_to_the_table_and_the_rejoin_button_stays_in_view(stack: Stack) -> None:
    """The page's own code draws an instance whose problem is long raw Tarantool text: one line cut with an
    ellipsis, the whole of it in the title, the table within its section, the rejoin button in view."""
    drawn = stack.browser.execute_script(_DRAW_LONG_PROBLEM, RAW_ERROR)
    assert drawn["title"] == "upstream: " + RAW_ERROR
    assert drawn["cut"], "the long text is cut, not shown whole"
    assert not drawn["overflows"], "the storage section does not scroll sideways"
    assert drawn["buttonRight"] <= drawn["sectionRight"], drawn


def test_every_action_route_answers_401_without_the_token_and_403_with_a_wrong_one(stack: Stack) -> None:
    app = make_app(from_args(["--listen", "127.0.0.1:0"], env={}))
    posts = {r.resource.canonical for r in app.router.routes() if r.method == "POST" and r.resource is not None}
    assert posts == set(ACTION_ROUTES), "every POST route is an action, and every action is walked here"
    for route in ACTION_ROUTES:
        none = httpx.post(stack.url + route, json={"instance": "x"}, timeout=10)
        assert none.status_code == 401, route
        assert none.headers["WWW-Authenticate"] == "Bearer"
        wrong = httpx.post(
            stack.url + route, json={"instance": "x"}, headers={"Authorization": "Bearer nope"}, timeout=10
        )
        assert wrong.status_code == 403, route
        assert TOKEN not in none.text + wrong.text
    # revealing session data needs the token too
    assert stack.api("/api/sessions?client_id=c&reveal=1").status_code == 401


def test_a_session_looked_up_by_client_id_is_listed_with_its_data_masked(stack: Stack) -> None:
    client_id = "client-console-" + uuid.uuid4().hex[:8]
    with Client(stack.service.endpoint, timeout_s=5) as c:
        created = c.session_create(client_id, data={"card": SECRET_DATA}, ttl_s=10)
        assert created.ok
        assert created.session_id is not None
        sid = str(created.session_id)
        # past a tenth of the ttl (1 s), a read would write a new deadline: the masked lookup must not read
        time.sleep(1.2)
        before = c.session_list(client_id).body["sessions"][0]["updated_at_ms"]
    b = stack.browser
    b.find_element(By.ID, "session-client").clear()
    b.find_element(By.ID, "session-client").send_keys(client_id)
    b.find_element(By.ID, "session-lookup").click()
    cell = f'tr[data-session="{sid}"] td.data'
    stack.shows(lambda: b.find_elements(By.CSS_SELECTOR, cell), 15, "the session is listed")
    shown = b.find_element(By.CSS_SELECTOR, cell).text
    assert shown.startswith("••••")
    assert SECRET_DATA not in shown
    _assert_nothing_secret_on_page(stack)
    with Client(stack.service.endpoint, timeout_s=5) as c:
        assert c.session_list(client_id).body["sessions"][0]["updated_at_ms"] == before  # not refreshed
    # with the token, and asked for, the API reveals it
    revealed = httpx.get(
        stack.url + "/api/sessions",
        params={"client_id": client_id, "reveal": "1"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    ).json()
    assert revealed["sessions"][0]["data"] == {"card": SECRET_DATA}


def _switchover_from_page(stack: Stack, leader: str) -> None:
    b = stack.browser
    b.find_element(By.ID, "switchover-button").click()
    stack.shows(lambda: b.find_element(By.ID, "confirm").is_displayed(), 5, "the confirmation asks")
    assert b.find_element(By.ID, "confirm-go").get_attribute("disabled") is not None  # not before it is typed
    b.find_element(By.ID, "confirm-input").send_keys(leader)
    b.find_element(By.ID, "confirm-go").click()


def test_a_switchover_from_the_page_is_refused_without_the_token_and_done_with_it(stack: Stack) -> None:
    b = stack.browser
    old = stack.address(stack.ha.leader())
    stack.shows(lambda: stack.text("leader") == old, 15, "the page shows the leader")
    b.find_element(By.ID, "token").clear()
    _switchover_from_page(stack, old)
    stack.shows(lambda: "refused: 401" in stack.text("action-result"), 15, "the page shows the refusal")
    assert stack.address(stack.ha.leader()) == old

    b.find_element(By.ID, "token").send_keys(TOKEN)
    _switchover_from_page(stack, old)
    stack.shows(lambda: stack.text("action-result").startswith("done"), 30, "the page shows the switchover done")
    new = stack.address(stack.ha.leader(exclude=()))
    assert new != old
    stack.shows(lambda: stack.text("leader") == new, 15, f"the page names {new} the leader")
    _assert_nothing_secret_on_page(stack)


def test_after_kill_9_of_the_leader_the_page_shows_the_new_one_within_ttl_plus_2_s(stack: Stack) -> None:
    name = stack.ha.leader()
    old = stack.address(name)
    stack.shows(lambda: stack.text("leader") == old, 15, "the page shows the leader")
    others = {stack.address(n) for n in stack.ha.nodes if n != name}
    os.kill(stack.ha.nodes[name].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    stack.shows(lambda: stack.text("leader") in others, TTL_S + 2, f"a new leader among {others} within TTL + 2 s")
    assert time.monotonic() - killed_at <= TTL_S + 2
    # the killed instance's part says so, with the time since its last answer
    stack.shows(
        lambda: f"({old}): no answer for" in stack.text("problems"), 10, "the problem list names the killed instance"
    )
    row = stack.browser.find_element(By.CSS_SELECTOR, f'tr[data-address="{old}"] .problem')
    assert row.text.startswith("no answer for")
    stack.shows(lambda: stack.text("health") == "degraded", 5, "degraded")
    assert not _section_overflows(stack), "the storage table keeps within its section, the rejoin buttons in view"
    _screenshot(stack, "console-failing.png")


def test_nothing_secret_is_in_the_console_log(stack: Stack) -> None:
    log = stack.log_path.read_text()
    assert "console_started" in log
    assert "console_action" in log  # the actions were logged...
    assert TOKEN not in log  # ...without the token
    assert SECRET_DATA not in log
    assert "client-console-" not in log  # nor whose sessions were looked up
