// smartcache console: polls the console's JSON API twice a second and draws the page.
// Every value is put in the DOM with textContent (never innerHTML); the token lives in this
// script's memory only (a password field, never an attribute, never stored).
"use strict";

const POLL_MS = 500;
const RATES_MS = 3000;
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function token() { return $("token").value.trim(); }

function authHeaders() {
  const t = token();
  return t ? { Authorization: "Bearer " + t } : {};
}

async function getJSON(path, headers) {
  const r = await fetch(path, { cache: "no-store", headers: headers || {} });
  const doc = await r.json();
  return { status: r.status, doc };
}

function seconds(s) {
  if (s === null || s === undefined) return "";
  return s < 120 ? `${Math.round(s)} s` : `${Math.round(s / 60)} min`;
}

// A cell's text that may be long (raw Tarantool or etcd error text): one line cut to the column's width with
// an ellipsis, the whole of it on hover (title), so the table keeps its layout and the rejoin buttons stay in view.
function clipped(text) {
  return text ? el("span", { class: "clip", title: text }, text) : "";
}

function since(ms) { return ms === null || ms === undefined ? "" : new Date(ms).toLocaleTimeString(); }

// -- the storage cluster ---------------------------------------------------------------

function vclockSum(v) { return Object.values(v || {}).reduce((a, b) => a + b, 0); }

function upstreamOf(i) {
  const r = (i.replication || []).find((x) => x.uuid === i.leader_uuid);
  if (!r || !r.upstream_status) return "";
  const lag = r.upstream_lag_s !== undefined && r.upstream_lag_s !== null ? ` lag ${r.upstream_lag_s.toFixed(3)} s` : "";
  return r.upstream_status + lag;
}

function instanceRows(instances, problems, shard) {
  const leader = instances.find((i) => i.role === "leader" && i.writable);
  const top = leader ? vclockSum(leader.vclock) : null;
  const body = el("tbody");
  for (const i of instances) {
    const name = i.name || i.address;
    const label = shard ? `${shard} ${name}` : name;
    let problem = "";
    if (!i.reachable) {
      problem = `no answer for ${seconds(i.no_answer_for_s)}`;
      problems.push(`instance ${label} (${i.address}): ${problem}`);
    } else if (i.diverged) {
      problem = `DIVERGED: ${JSON.stringify(i.diverged)}`;
      problems.push(`instance ${label}: ${problem}`);
    } else if (i.fenced) {
      problem = `fenced: ${i.fence_reason || ""}`;
      problems.push(`instance ${label}: ${problem}`);
    } else if (i.upstream_problem) {
      problem = `upstream: ${i.upstream_problem}`;
    }
    if (i.reachable && i.rejoin_refused) {
      problem = `${problem}; not rebuilding by itself: ${i.rejoin_refused}`;
      problems.push(`instance ${label}: ${problem}`);
    }
    const lag = top !== null && i.reachable && i.vclock ? top - vclockSum(i.vclock) : null;
    const rejoin = el("button", { type: "button", class: "rejoin", textContent: "rejoin…" });
    rejoin.addEventListener("click", () => askRejoin(i));
    const row = el("tr", { "data-address": i.address, class: i.reachable ? i.role || "" : "down" },
      el("td", {}, name), el("td", {}, i.address),
      el("td", { class: "role" }, i.reachable ? i.role : "down"),
      el("td", {}, i.term ?? ""), el("td", {}, i.reachable && i.role === "leader" ? seconds(i.lease_left_ms / 1000) : ""),
      el("td", {}, lag === null ? "" : lag), el("td", {}, i.reachable ? upstreamOf(i) : ""),
      el("td", { class: "problem" }, clipped(problem)), el("td", {}, i.reachable && i.role !== "leader" ? rejoin : ""));
    body.append(row);
  }
  return body;
}

function topologyTable(status, problems, shard) {
  const head = el("thead", {}, el("tr", {}, ...["instance", "address", "role", "term", "lease left", "vclock lag",
    "upstream", "problem", ""].map((h) => el("th", {}, h))));
  return el("table", { class: "grid" }, head, instanceRows(status.instances || [], problems, shard));
}

function drawEtcd(etcd, problems) {
  const body = $("etcd");
  body.replaceChildren();
  if (!etcd) return;
  if (etcd.skipped) { $("etcd-summary").textContent = etcd.skipped; return; }
  $("etcd-summary").textContent = `${etcd.members_healthy || ""} healthy, leader ${etcd.leader || "none"}`;
  for (const m of etcd.members || []) {
    let problem = m.reachable ? (m.errors ? String(m.errors) : "") : `no answer for ${seconds(m.no_answer_for_s)}`;
    if (!m.reachable) problems.push(`etcd ${m.name || m.endpoint}: ${problem}`);
    body.append(el("tr", { class: m.state }, el("td", {}, m.name || m.id), el("td", {}, m.endpoint || ""),
      el("td", { class: "role" }, m.state), el("td", {}, m.raft_term ?? ""), el("td", { class: "problem" }, clipped(problem))));
  }
}

let current = { leader: null };

function drawStatus(s, problems) {
  const data = s.data || {};
  current = { leader: s.leader, readOnly: s.read_only };
  $("leader").textContent = s.leader || (s.leaders && Object.keys(s.leaders).length > 1
    ? Object.entries(s.leaders).map(([k, v]) => `${k}: ${v || "none"}`).join(", ") : "none");
  $("term").textContent = s.term !== null && s.term !== undefined ? `term ${s.term}` : "";
  $("health").textContent = s.healthy ? "healthy" : "degraded";
  $("health").className = "badge " + (s.healthy ? "ok" : "bad");
  if (!s.ok) problems.push(`storage: ${s.error}` + (s.no_answer_for_s !== undefined ? ` (no answer for ${seconds(s.no_answer_for_s)})` : ""));
  const topo = $("topology");
  topo.replaceChildren();
  if (data.shards) {
    for (const [name, shard] of Object.entries(data.shards)) {
      const b = shard.buckets || {};
      topo.append(el("h3", {}, `shard ${name}`, el("span", { class: "muted" },
        ` leader ${shard.leader || "none"}, ${b.active ?? "?"} buckets active, ${(b.moving || []).length} moving`)));
      topo.append(topologyTable(shard, problems, name));
    }
    drawEtcd(Object.values(data.shards)[0]?.etcd, problems);
  } else {
    $("cluster-name").textContent = data.topology && data.topology.cluster ? `cluster ${data.topology.cluster}` : "";
    topo.append(topologyTable(data, problems, null));
    drawEtcd(data.etcd, problems);
  }
}

// -- services ---------------------------------------------------------------------------

function kv(obj) {
  return Object.entries(obj || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
}

function drawServices(doc, problems) {
  const box = $("services");
  box.replaceChildren();
  for (const s of doc.services || []) {
    const d = s.data || {};
    if (!s.ok) problems.push(`${s.name} (${s.endpoint}): ${s.error}, no answer for ${seconds(s.no_answer_for_s)}`);
    if (!s.metrics_ok) problems.push(`${s.name} metrics: ${s.metrics_error}`);
    const q = d.queue || {}, w = d.workers || {};
    const leaderSeen = (d.storage || []).filter((x) => x.leader).map((x) => x.address).join(", ") || "none";
    box.append(el("div", { class: "card " + (s.ok ? "ok" : "bad"), "data-service": s.name },
      el("h3", {}, s.name, " ", el("span", { class: "muted" }, s.endpoint)),
      s.ok ? null : el("p", { class: "problem" }, `no answer for ${seconds(s.no_answer_for_s)}: ${s.error}`),
      el("dl", {},
        el("dt", {}, "queue"), el("dd", {}, `${q.depth ?? "?"} / ${q.capacity ?? "?"}${q.stopping ? " (stopping)" : ""}`),
        el("dt", {}, "busy slots"), el("dd", {}, `${w.busy ?? "?"} / ${w.slots ?? "?"}: ${kv(w.busy_by_type)}`),
        el("dt", {}, "queue refusals"), el("dd", {}, kv(s.rejections)),
        el("dt", {}, "storage leader seen"), el("dd", { class: "leader-seen" }, leaderSeen),
        el("dt", {}, "uptime"), el("dd", {}, seconds(d.uptime_s)),
        el("dt", {}, "version"), el("dd", {}, d.version || "?"),
        s.age_s !== undefined ? el("dt", {}, "answered") : null,
        s.age_s !== undefined ? el("dd", {}, `${seconds(s.age_s)} ago`) : null)));
  }
}

// -- rates ------------------------------------------------------------------------------

const charts = {};
const COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1", "#b7791f", "#2c7a7b"];

function chart(id, xs, named) {
  const box = $(id);
  if (typeof uPlot === "undefined") {
    if (!box.querySelector(".muted")) box.append(el("p", { class: "muted" }, "uPlot missing: make console-assets"));
    return;
  }
  const names = Object.keys(named);
  const key = names.join("|");
  const data = [xs, ...names.map((n) => named[n])];
  const c = charts[id];
  if (c && c.key === key) { c.plot.setData(data); return; }
  if (c) c.plot.destroy();
  const opts = {
    width: Math.max(260, box.clientWidth - 10), height: 140, legend: { show: true },
    series: [{}, ...names.map((n, k) => ({ label: n, stroke: COLORS[k % COLORS.length], width: 1.5, spanGaps: true }))],
    axes: [{ space: 60 }, { size: 50 }],
  };
  charts[id] = { key, plot: new uPlot(opts, data, box) };
}

function drawRates(doc) {
  const services = doc.services || [];
  if (!services.length) return;
  const xs = services[0].t;  // each service's own clock of scrapes; the first one's is the axis
  const at = (s, arr) => xs.map((t) => { const k = s.t.indexOf(t); return k < 0 ? null : arr[k]; });
  const req = {}, p99 = {}, fo = {}, err = {};
  for (const s of services) {
    req[s.name] = at(s, s.requests_per_s);
    p99[s.name] = at(s, s.p99_ms);
    fo[s.name] = at(s, s.failovers);
    for (const [kind, arr] of Object.entries(s.errors_per_s || {})) err[`${s.name} ${kind}`] = at(s, arr);
  }
  $("rates-note").textContent = xs.length ? `${xs.length} points` : "collecting (a point per scrape)";
  chart("chart-requests", xs, req);
  chart("chart-errors", xs, Object.keys(err).length ? err : { none: xs.map(() => 0) });
  chart("chart-p99", xs, p99);
  chart("chart-failovers", xs, fo);
}

// -- events and leader changes ----------------------------------------------------------

function drawEvents(doc) {
  $("events-note").textContent = doc.ok ? "" : `(${doc.error})`;
  $("events").replaceChildren(...(doc.events || []).slice(0, 20).map((e) => el("tr", {},
    el("td", {}, e.seq), el("td", {}, since(e.time_ms)), el("td", {}, e.topic), el("td", {}, e.key),
    el("td", {}, `${e.payload.masked} ${e.payload.bytes} B`))));
}

function drawLeaderChanges(doc) {
  $("leader-changes").replaceChildren(...(doc.changes || []).slice(0, 20).map((c) => el("tr", {},
    el("td", {}, since(c.at * 1000)), el("td", {}, c.shard || ""), el("td", {}, c.first_seen ? "(console start)" : c.from || "none"),
    el("td", {}, c.to || "none"), el("td", {}, c.term ?? ""))));
}

// -- sessions -----------------------------------------------------------------------------

// A session id is a credential: the lookup never sends one (the console would refuse it too, saying the same).
const UUID_LIKE = /^(urn:uuid:)?\{?[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\}?$/i;
const REFUSED_ID = "that is a session id (a UUID): a session id is a credential (whoever holds it is the customer), " +
  "so the console never takes one. Look the session up by its client id, or by its handle (h and 26 letters and " +
  "digits, as session lists and events show it)";
const HANDLE = /^h[a-z2-7]{26}$/;

function shownData(d) {
  if (d === null || d === undefined) return "";
  if (d.masked) return d.bytes === undefined ? d.masked : `${d.masked} (${d.bytes} B)`;
  return JSON.stringify(d);
}

// What was typed, or null (said in the box) when it is a session id or nothing.
function query() {
  const box = $("sessions");
  const q = $("session-query").value.trim();
  if (!q) { box.replaceChildren(el("p", { class: "problem refused" }, "type a client id or a session's handle")); return null; }
  if (UUID_LIKE.test(q)) {
    $("session-query").value = "";  // not kept in the page either
    box.replaceChildren(el("p", { class: "problem refused", id: "session-refused" }, `refused: ${REFUSED_ID}`));
    return null;
  }
  return q;
}

function drawSessions(doc, q) {
  const rows = (doc.sessions || []).map((s) => el("tr", { "data-handle": s.handle }, el("td", {}, s.handle),
    el("td", {}, s.client_id || ""), el("td", {}, s.version || ""), el("td", {}, s.rev ?? ""),
    el("td", {}, since(s.updated_at_ms)), el("td", {}, seconds((s.expires_in_ms || 0) / 1000)),
    el("td", {}, seconds((s.absolute_expires_in_ms || 0) / 1000)), el("td", {}, s.device || ""),
    el("td", {}, s.bound ? "yes" : ""), el("td", { class: "data" }, shownData(s.data))));
  const head = el("tr", {}, ...["handle", "client", "version", "rev", "updated", "expires in", "ends in at most",
    "device", "bound", "data"].map((h) => el("th", {}, h)));
  const what = HANDLE.test(q) ? "handle" : "client";
  $("sessions").replaceChildren(el("p", { class: "muted" },
    `${rows.length} session(s)${doc.count > rows.length ? ` of ${doc.count}` : ""} for this ${what}` +
    (doc.revealed ? ": data revealed (written to the audit)" : "")),
  el("table", { class: "grid", id: "session-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

async function lookUp(ev) {
  ev.preventDefault();
  const q = query();
  if (q === null) return;
  const box = $("sessions");
  box.replaceChildren(el("p", { class: "muted" }, "asking…"));
  try {
    const { status, doc } = await getJSON("/api/sessions?" + new URLSearchParams({ q }));
    if (status !== 200) { box.replaceChildren(el("p", { class: "problem refused" }, `refused: ${status} ${doc.error}: ${doc.message}`)); return; }
    drawSessions(doc, q);
  } catch (e) {
    box.replaceChildren(el("p", { class: "problem" }, `no answer: ${e}`));
  }
}

function askReveal() {
  const q = query();
  if (q === null) return;
  confirmThen(`Reveal the data of ${HANDLE.test(q) ? "the session" : "the sessions of client"} ${q}? It is written to ` +
    "the audit log with your token's id and the reason.", q, async (reason) => {
    const doc = await post("/api/actions/reveal", { query: q, reason });
    if (doc && doc.status === "OK") drawSessions({ ...doc, revealed: true }, q);
  });
}

function askLogout() {
  const q = query();
  if (q === null) return;
  confirmThen(`End every session of client ${q} (log out everywhere)? Its devices must log in again.`, q,
    (reason) => post("/api/actions/logout", { client_id: q, reason }));
}

// -- actions ----------------------------------------------------------------------------

let pending = null;

function confirmThen(text, expected, run) {
  pending = { expected, run };
  $("confirm-text").textContent = text;
  $("confirm-expected").textContent = expected;
  $("confirm-input").value = "";
  $("confirm-reason").value = "";
  $("confirm-go").disabled = true;
  $("confirm").showModal();
  $("confirm-input").focus();
}

function confirmable() {
  return $("confirm-input").value.trim() === pending?.expected && $("confirm-reason").value.trim() !== "";
}

function showResult(ok, text) {
  const r = $("action-result");
  r.hidden = false;
  r.className = "result " + (ok ? "ok" : "refused");
  r.textContent = text;
}

// The action's answer is shown (a reveal's sessions are drawn in their table instead) and returned.
async function post(path, body) {
  showResult(true, `${path}: asked…`);
  try {
    const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body) });
    const doc = await r.json();
    if (r.status === 401 || r.status === 403 || r.status === 400) { showResult(false, `refused: ${r.status} ${doc.error}: ${doc.message}`); return null; }
    const ok = r.ok && doc.status === "OK";
    const shown = { ...doc };
    if (shown.sessions) shown.sessions = `${shown.sessions.length} shown below`;
    showResult(ok, `${ok ? "done" : "not done"}: ${JSON.stringify(shown)}`);
    return doc;
  } catch (e) {
    showResult(false, `no answer: ${e}`);
    return null;
  }
}

function askSwitchover() {
  const leader = current.leader;
  if (!leader) { showResult(false, "no leader now: nothing to hand over"); return; }
  confirmThen(`Hand over from the leader ${leader} to the most up-to-date follower? Writes pause for the hand-over.`,
    leader, (reason) => post("/api/actions/switchover", { reason }));
}

function askRejoin(i) {
  confirmThen(`Rebuild ${i.name || i.address} from the leader? It restarts empty and copies the leader's data.`,
    i.address, (reason) => post("/api/actions/rejoin", { instance: i.address, force: !i.diverged, reason }));
}

// -- the audit log ------------------------------------------------------------------------

function drawAudit(doc) {
  $("audit-note").textContent = doc.ok ? "operator actions, newest first" : `(${doc.error})`;
  $("audit").replaceChildren(...(doc.entries || []).slice(0, 20).map((a) => {
    const d = a.details || {};
    return el("tr", { "data-seq": a.seq, "data-action": a.action },
      el("td", {}, since(a.time_ms)), el("td", {}, a.shard ? `${a.shard}:${a.seq}` : a.seq), el("td", {}, a.who),
      el("td", {}, a.action), el("td", {}, clipped(a.target)), el("td", {}, [d.phase, d.status].filter(Boolean).join(" ")),
      el("td", {}, clipped(a.reason)));
  }));
}

// -- the loop -----------------------------------------------------------------------------

async function tick() {
  const started = Date.now();
  const problems = [];
  try {
    const [st, sv, ev, lc, au] = await Promise.all([getJSON("/api/status"), getJSON("/api/services"),
      getJSON("/api/events"), getJSON("/api/leader-changes"), getJSON("/api/audit")]);
    drawStatus(st.doc, problems);
    drawServices(sv.doc, problems);
    drawEvents(ev.doc);
    drawLeaderChanges(lc.doc);
    drawAudit(au.doc);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    problems.push(`console: no answer (${e})`);
  }
  $("problems").replaceChildren(...problems.map((p) => el("li", { class: "problem" }, p)));
  setTimeout(tick, Math.max(50, POLL_MS - (Date.now() - started)));  // POLL_MS start to start
}

async function ratesTick() {
  try { drawRates((await getJSON("/api/rates")).doc); } catch (e) { /* shown by tick */ }
  setTimeout(ratesTick, RATES_MS);
}

$("session-form").addEventListener("submit", lookUp);
$("session-reveal").addEventListener("click", askReveal);
$("session-logout").addEventListener("click", askLogout);
$("token-form").addEventListener("submit", (ev) => ev.preventDefault());
$("switchover-button").addEventListener("click", askSwitchover);
for (const id of ["confirm-input", "confirm-reason"]) $(id).addEventListener("input", () => { $("confirm-go").disabled = !confirmable(); });
$("confirm-cancel").addEventListener("click", () => { pending = null; $("confirm").close(); });
$("confirm-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const p = pending;
  pending = null;
  $("confirm").close();
  const reason = $("confirm-reason").value.trim();
  if (p && $("confirm-input").value.trim() === p.expected && reason) p.run(reason);
});
tick();
ratesTick();
