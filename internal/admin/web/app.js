// Courier dashboard: polls the management API (/api/...) and draws what it
// reads. Plain JavaScript, no build step, no outside resources.
"use strict";

// The listener's Content-Security-Policy allows no inline script or style:
// report anything it blocks, so that a change that needs one shows.
document.addEventListener("securitypolicyviolation", (e) =>
  console.error("Content-Security-Policy blocked", e.violatedDirective, e.blockedURI || "inline"));

const REFRESH_MS = 2000;
const CHART_AGE = 300; // seconds of history in the rate chart
const CHART_INCR = 2; // seconds between chart samples

const RATE_SERIES = [
  { key: "publish", name: "Publish", color: "#f97316" },
  { key: "request", name: "Request", color: "#2563eb" },
  { key: "deliver", name: "Deliver", color: "#16a34a" },
  { key: "response", name: "Response", color: "#9333ea", dash: [6, 4] }, // often equal to requests
  { key: "ack", name: "Ack", color: "#64748b" },
];
const QUEUED_SERIES = [
  { key: "messages_ready", name: "Ready", color: "#0ea5e9" },
  { key: "messages_unacknowledged", name: "Unacked", color: "#e11d48" },
];

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

// ---- formatting ----

function fmtInt(n) {
  if (n === undefined || n === null) return "–";
  return Math.round(n).toLocaleString("en-US");
}

function fmtRate(r) {
  if (r === undefined || r === null) return "–";
  if (r >= 100) return fmtInt(r) + "/s";
  return r.toFixed(1) + "/s";
}

function fmtBytes(b) {
  if (b === undefined || b === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (i === 0 ? b : b.toFixed(1)) + " " + units[i];
}

function fmtDuration(ms) {
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return d + "d " + h + "h";
  if (h) return h + "h " + m + "m";
  if (m) return m + "m " + s + "s";
  return s + "s";
}

function fmtSince(ms) {
  if (!ms) return "–";
  return fmtDuration(Date.now() - ms) + " ago";
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "title") e.title = v;
    else if (k === "style") e.style.cssText = v; // CSSOM: a style attribute would be inline style, which the CSP refuses
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// ---- API ----

async function api(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    const why = body && body.reason ? body.reason : resp.statusText;
    throw new Error(path + ": " + resp.status + " " + why);
  }
  return body;
}

// send makes a change through the API: method, path and an optional JSON
// body; it returns the answer's JSON (null for none) or throws with the
// API's reason.
async function send(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!resp.ok) {
    throw new Error(resp.status + " " + (data && data.reason ? data.reason : resp.statusText));
  }
  return data;
}

// notify shows the outcome of an action in a banner for a few seconds.
let noticeTimer = null;
function notify(text, bad) {
  const b = $("#notice");
  b.textContent = text;
  b.className = "banner notice" + (bad ? " bad" : "");
  b.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { b.hidden = true; }, 8000);
}

// confirmAction asks in a dialog of the page, not window.confirm, which
// a browser may suppress; it resolves true when confirmed.
function confirmAction(title, text, okLabel) {
  const d = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = okLabel || "Confirm";
  d.returnValue = "";
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.showModal();
  });
}

const enc = encodeURIComponent;

function showError(err) {
  const b = $("#error");
  const dot = $("#live-dot");
  if (err) {
    b.textContent = "Cannot reach the management API: " + err.message;
    b.hidden = false;
    dot.className = "dot down";
  } else {
    b.hidden = true;
    dot.className = "dot live";
  }
}

// showAlarms shows the node's alarms (memory, disk, store, component) in
// a banner at the top of every page while any is on.
function showAlarms(alarms) {
  const b = $("#alarms");
  if (!alarms || !alarms.length) {
    b.hidden = true;
    b.replaceChildren();
    b.dataset.kinds = "";
    return;
  }
  b.dataset.kinds = alarms.map((a) => a.kind).join(",");
  b.replaceChildren(
    el("span", { class: "alarm-title" }, alarms.length === 1 ? "Alarm:" : alarms.length + " alarms:"),
    el("ul", {}, ...alarms.map((a) => el("li", { "data-kind": a.kind },
      el("span", { class: "kind" }, a.kind + (a.resource ? " " + a.resource : "")), a.message))));
  b.hidden = false;
}

// ---- charts (canvas, drawn by hand) ----

function niceStep(max, ticks) {
  const raw = max / ticks;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  const step = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10;
  return step * mag;
}

function shortNum(v) {
  if (v >= 1e9) return (v / 1e9).toFixed(v % 1e9 ? 1 : 0) + "G";
  if (v >= 1e6) return (v / 1e6).toFixed(v % 1e6 ? 1 : 0) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(v % 1e3 ? 1 : 0) + "k";
  return String(Math.round(v * 100) / 100);
}

// drawChart draws series of [time ms, value] points over the last spanMs.
function drawChart(canvas, series, spanMs, now) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const padL = 52, padR = 12, padT = 10, padB = 24;
  const pw = w - padL - padR, ph = h - padT - padB;

  let max = 0;
  for (const s of series) for (const p of s.points) max = Math.max(max, p[1]);
  const step = max > 0 ? niceStep(max, 4) : 1;
  const top = max > 0 ? Math.ceil(max / step) * step : 4;

  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#6b7280";
  ctx.strokeStyle = "#eceff3";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= top + step / 2; v += step) {
    const y = padT + ph - (v / top) * ph;
    ctx.beginPath();
    ctx.moveTo(padL, Math.round(y) + 0.5);
    ctx.lineTo(padL + pw, Math.round(y) + 0.5);
    ctx.stroke();
    ctx.fillText(shortNum(v), padL - 8, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const minutes = spanMs / 60000;
  const every = minutes > 4 ? 60000 : minutes > 1 ? 30000 : 10000;
  for (let t = 0; t <= spanMs; t += every) {
    const x = padL + pw - (t / spanMs) * pw;
    ctx.fillText(t === 0 ? "now" : "-" + (t >= 60000 ? t / 60000 + "m" : t / 1000 + "s"), x, padT + ph + 6);
  }

  const x0 = now - spanMs;
  ctx.save();
  ctx.beginPath();
  ctx.rect(padL, padT - 2, pw, ph + 4);
  ctx.clip();
  for (const s of series) {
    const pts = s.points.filter((p) => p[0] >= x0 - 10000);
    if (pts.length < 2) continue;
    const xy = pts.map((p) => [padL + ((p[0] - x0) / spanMs) * pw, padT + ph - (p[1] / top) * ph]);
    ctx.beginPath();
    xy.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 2;
    ctx.lineJoin = "round";
    ctx.setLineDash(s.dash || []);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.lineTo(xy[xy.length - 1][0], padT + ph);
    ctx.lineTo(xy[0][0], padT + ph);
    ctx.closePath();
    ctx.globalAlpha = 0.08;
    ctx.fillStyle = s.color;
    ctx.fill();
    ctx.globalAlpha = 1;
  }
  ctx.restore();
}

// legend shows each series' colour, name and current value; the value of
// series k has the id prefix+k, its total prefix+k+"-total".
function legend(container, series, prefix, values, totals) {
  if (!container.childElementCount) {
    for (const s of series) {
      container.append(
        el("div", { class: "item" },
          el("span", { class: "swatch", style: "background:" + s.color }),
          el("span", { class: "name" }, s.name),
          el("span", { class: "val", id: prefix + s.key }, "–"),
          totals ? el("span", { class: "total", id: prefix + s.key + "-total" }, "") : null));
    }
  }
  for (const s of series) {
    $("#" + prefix + s.key).textContent = values[s.key];
    if (totals) $("#" + prefix + s.key + "-total").textContent = totals[s.key];
  }
}

// ratePoints turns RabbitMQ-style samples (newest first, cumulative) into
// [time, rate] points.
function ratePoints(samples) {
  const pts = [];
  for (let i = samples.length - 2; i >= 0; i--) {
    const a = samples[i + 1], b = samples[i];
    const dt = (b.timestamp - a.timestamp) / 1000;
    if (dt > 0) pts.push([b.timestamp, Math.max(0, (b.sample - a.sample) / dt)]);
  }
  return pts;
}

// chartSpan is the time a chart shows: the history there is, from one
// minute to CHART_AGE, rounded up to a whole minute.
function chartSpan(ms) {
  return Math.min(CHART_AGE * 1000, Math.max(60000, Math.ceil(ms / 60000) * 60000));
}

// ---- overview ----

async function refreshOverview(full) {
  const path = full ? "/api/overview?msg_rates_age=" + CHART_AGE + "&msg_rates_incr=" + CHART_INCR : "/api/overview";
  const o = await api(path);
  $("#node-name").textContent = o.node;
  thisNode = o.node;
  $("#node-version").textContent = o.courier_version;
  $("#node-uptime").textContent = fmtDuration(o.uptime);
  const t = o.object_totals;
  $("#nav-exchanges").textContent = fmtInt(t.exchanges);
  $("#nav-queues").textContent = fmtInt(t.queues);
  $("#nav-connections").textContent = fmtInt(t.connections);
  showAlarms(o.alarms);
  if (!full) return;

  $("#total-connections").textContent = fmtInt(t.connections);
  $("#total-exchanges").textContent = fmtInt(t.exchanges);
  $("#total-queues").textContent = fmtInt(t.queues);
  $("#total-attachments").textContent = fmtInt(t.attachments);
  $("#total-ready").textContent = fmtInt(o.queue_totals.messages_ready);
  $("#total-unacked").textContent = fmtInt(o.queue_totals.messages_unacknowledged);

  const ms = o.message_stats;
  const now = Date.now();
  const rateSeries = RATE_SERIES.map((s) => ({ ...s, points: ratePoints(ms[s.key + "_details"].samples || []) }));
  const latest = rateSeries.reduce((m, s) => Math.max(m, s.points.length ? s.points[s.points.length - 1][0] : 0), 0);
  const oldest = rateSeries.reduce((m, s) => Math.min(m, s.points.length ? s.points[0][0] : m), latest || now);
  const span = chartSpan((latest || now) - oldest);
  $("#chart-span").textContent = span >= 120000 ? span / 60000 + " minutes" : span / 1000 + " seconds";
  drawChart($("#chart-rates"), rateSeries, span, latest || now);
  const rates = {}, totals = {};
  for (const s of RATE_SERIES) {
    rates[s.key] = fmtRate(ms[s.key + "_details"].rate);
    totals[s.key] = fmtInt(ms[s.key]) + " total";
  }
  legend($("#legend-rates"), RATE_SERIES, "rate-", rates, totals);

  // The server keeps the history: the chart is full from the first poll.
  const queued = QUEUED_SERIES.map((s) => ({ ...s,
    points: (o.queue_totals[s.key + "_details"] ? o.queue_totals[s.key + "_details"].samples : []).map((p) => [p.timestamp, p.sample]).reverse() }));
  const qLatest = queued[0].points.length ? queued[0].points[queued[0].points.length - 1][0] : now;
  const qOldest = queued[0].points.length ? queued[0].points[0][0] : now;
  const qSpan = chartSpan(qLatest - qOldest);
  $("#queued-span").textContent = qSpan >= 120000 ? qSpan / 60000 + " minutes" : qSpan / 1000 + " seconds";
  drawChart($("#chart-queued"), queued, qSpan, qLatest);
  legend($("#legend-queued"), QUEUED_SERIES, "queued-", {
    messages_ready: fmtInt(o.queue_totals.messages_ready),
    messages_unacknowledged: fmtInt(o.queue_totals.messages_unacknowledged),
  });

  const nodes = await api("/api/nodes");
  const n = nodes.find((x) => x.name === o.node) || nodes[0];
  const rows = [
    ["Node", n.name],
    ["Version", n.courier_version + " (" + n.go_version + ")"],
    ["Uptime", fmtDuration(n.uptime)],
    ["Memory used", fmtBytes(n.mem_used)],
    ["Queue memory", n.mem_budget_limit ? fmtBytes(n.mem_budget_used) + " (paging from half of " + fmtBytes(n.mem_budget) + ", alarm at " + fmtBytes(n.mem_budget_limit) + ")" + (n.mem_alarm ? " (alarm)" : "") : "no budget"],
    ["Disk free", n.disk_free >= 0 ? fmtBytes(n.disk_free) + (n.disk_free_alarm ? " (alarm)" : "") : "unknown"],
    ["Goroutines", fmtInt(n.goroutines)],
    ["Processors", fmtInt(n.processors)],
    ["Process id", n.os_pid],
    ["Listeners", n.listeners.map((l) => l.protocol + " " + l.address).join(", ")],
  ];
  const tb = $("#node-table tbody");
  tb.replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
}

// ---- lists ----

// thisNode is the name of the node serving the dashboard.
let thisNode = "";

// nodeLink renders this node's link with a node of /api/nodes.
function nodeLink(x) {
  if (x.name === thisNode) return muted(x.cluster_address ? "this node" : "single node");
  const l = (x.links || [])[0];
  if (!l) return muted("–");
  const rtt = l.rtt_ms > 0 ? " · " + l.rtt_ms.toFixed(2) + " ms" : "";
  return el("span", { title: "control " + fmtInt(l.control.frames_out) + " frames out, " + fmtInt(l.control.frames_in) + " in; data " +
    fmtInt(l.data.frames_out) + " out, " + fmtInt(l.data.frames_in) + " in (" + fmtBytes(l.data.bytes_out) + " / " + fmtBytes(l.data.bytes_in) + ")" },
    tag(l.up ? "alive" : "dead", l.up ? "up" : "down"), rtt);
}

const tag = (cls, text) => el("span", { class: "tag " + cls }, text);

const LISTS = {
  exchanges: {
    path: "/api/exchanges",
    empty: "No exchanges. Create one with `courier exchanges create <name>` or PUT /api/exchanges/<name>.",
    columns: [
      { key: "name", label: "Name", cls: "name", render: (x) => el("a", { href: "#exchange/" + enc(x.name) }, x.name) },
      { key: "pattern", label: "Pattern", render: (x) => tag(x.pattern, x.pattern) },
      { key: "strategy", label: "Strategy", render: (x) => x.strategy || el("span", { class: "muted" }, "–") },
      { key: "members", label: "Members", fetch: ["members", "leader"], render: (x) => {
        if (!x.members.length) return el("span", { class: "muted" }, "none");
        const shown = x.members.slice(0, 6).map((m) =>
          el("span", { class: "member" + (m.id === x.leader ? " leader" : ""), title: m.role + (m.id === x.leader ? ", leader" : "") + (m.service_tag ? ", tag " + m.service_tag : "") }, m.id));
        if (x.members.length > 6) shown.push(el("span", { class: "muted" }, "+" + (x.members.length - 6)));
        return el("span", {}, ...shown);
      } },
      { key: "leader", label: "Leader", cls: "mono", render: (x) => x.leader || el("span", { class: "muted" }, "–") },
      { key: "subscribers", label: "Subscribers", num: true, render: (x) => fmtInt(x.subscribers) },
      { key: "message_stats.request_details.rate", label: "Requests/s", num: true, fetch: ["message_stats.request_details.rate"], render: (x) => fmtRate(x.message_stats.request_details.rate) },
      { key: "message_stats.publish_details.rate", label: "Publishes/s", num: true, fetch: ["message_stats.publish_details.rate"], render: (x) => fmtRate(x.message_stats.publish_details.rate) },
      { key: "message_stats.request", label: "Requests", num: true, render: (x) => fmtInt(x.message_stats.request) },
      { key: "message_stats.publish", label: "Publishes", num: true, render: (x) => fmtInt(x.message_stats.publish) },
    ],
  },
  queues: {
    path: "/api/queues",
    empty: "No queues yet.",
    columns: [
      { key: "name", label: "Name", cls: "name", render: (x) => el("a", { href: "#queue/" + enc(x.name) }, x.name) },
      { key: "messages", label: "Messages", num: true, render: (x) => fmtInt(x.messages) },
      { key: "messages_ready", label: "Ready", num: true, render: (x) => fmtInt(x.messages_ready) },
      { key: "messages_unacknowledged", label: "Unacked", num: true, render: (x) => fmtInt(x.messages_unacknowledged) },
      { key: "consumers", label: "Consumers", num: true, render: (x) => fmtInt(x.consumers) },
      { key: "memory", label: "Memory", num: true, render: (x) => fmtBytes(x.memory) },
      { key: "message_stats.publish_details.rate", label: "Publish/s", num: true, render: (x) => fmtRate(x.message_stats.publish_details.rate) },
      { key: "message_stats.deliver_details.rate", label: "Deliver/s", num: true, render: (x) => fmtRate(x.message_stats.deliver_details.rate) },
      { key: "message_stats.ack_details.rate", label: "Ack/s", num: true, render: (x) => fmtRate(x.message_stats.ack_details.rate) },
      { key: "type", label: "Type", render: (x) => tag(x.type, x.type) },
      { key: "leader", label: "Leader", render: (x) => x.leader || muted("–") },
      { key: "online", label: "Online", num: true, fetch: ["online", "members"], render: (x) => x.type === "quorum"
        ? el("span", { title: "online: " + (x.online.join(", ") || "none") + "; replicas: " + x.members.join(", ") }, x.online.length + " of " + x.members.length)
        : muted("–") },
    ],
  },
  connections: {
    path: "/api/connections",
    empty: "No connections.",
    columns: [
      { key: "id", label: "Id", cls: "mono" },
      { key: "name", label: "Name", cls: "name" },
      { key: "type", label: "Type", render: (x) => tag(x.type, x.type) },
      { key: "protocol", label: "Protocol", render: (x) => x.protocol || el("span", { class: "muted" }, "–") },
      { key: "transport", label: "Transport", render: (x) => x.transport || el("span", { class: "muted" }, "in-process") },
      { key: "peer", label: "Peer", cls: "mono", render: (x) => x.peer || el("span", { class: "muted" }, "in-process") },
      { key: "user", label: "User", render: (x) => x.user || el("span", { class: "muted" }, "–") },
      { key: "attachments", label: "Attachments", num: true, render: (x) => fmtInt(x.attachments) },
      { key: "inflight", label: "In flight", num: true, render: (x) => fmtInt(x.inflight) },
      { key: "connected_at", label: "Connected", render: (x) => el("span", { title: new Date(x.connected_at).toLocaleString() }, fmtSince(x.connected_at)) },
      { key: "message_stats.request_details.rate", label: "Requests/s", num: true, render: (x) => fmtRate(x.message_stats.request_details.rate) },
      { key: "message_stats.publish_details.rate", label: "Publishes/s", num: true, render: (x) => fmtRate(x.message_stats.publish_details.rate) },
      { key: "message_stats.deliver_details.rate", label: "Delivered/s", num: true, render: (x) => fmtRate(x.message_stats.deliver_details.rate) },
      { key: "message_stats.response_details.rate", label: "Responses/s", num: true, render: (x) => fmtRate(x.message_stats.response_details.rate) },
      { key: "close", label: "", nosort: true, fetch: [], render: (x) => x.type === "network"
        ? el("button", { type: "button", class: "small danger", "data-close": x.id, title: "close this connection" }, "Close")
        : null },
    ],
  },
};

LISTS.nodes = {
  path: "/api/nodes",
  empty: "No nodes.",
  columns: [
    { key: "name", label: "Name", cls: "name", render: (x) => x.name === thisNode ? el("span", {}, x.name + " ", tag("self", "this node")) : x.name },
    { key: "state", label: "State", fetch: ["state", "state_since"], render: (x) => el("span", { title: "since " + new Date(x.state_since).toLocaleString() }, tag(x.state, x.state), " ", muted(fmtSince(x.state_since))) },
    { key: "uptime", label: "Uptime", num: true, render: (x) => x.uptime > 0 ? fmtDuration(x.uptime) : muted("–") },
    { key: "cluster_address", label: "Cluster address", cls: "mono", render: (x) => x.cluster_address || muted("–") },
    { key: "client_url", label: "Client URL", cls: "mono", render: (x) => x.client_url || muted("–") },
    { key: "http_url", label: "Dashboard", cls: "mono", render: (x) => x.http_url ? el("a", { href: x.http_url + "/#nodes" }, x.http_url) : muted("–") },
    { key: "meta_leader", label: "Meta leader", render: (x) => x.meta_leader ? tag("leader", "leader") : muted("no") },
    { key: "connections", label: "Connections", num: true, render: (x) => fmtInt(x.connections) },
    { key: "exchanges", label: "Exchanges", num: true, render: (x) => fmtInt(x.exchanges) },
    { key: "queues", label: "Queues", num: true, render: (x) => fmtInt(x.queues) },
    { key: "links", label: "Link", nosort: true, fetch: ["links", "cluster_address"], render: nodeLink },
  ],
};

// Per list: sort, reverse, page, page size, filter.
const state = {};
for (const name of Object.keys(LISTS)) {
  state[name] = { sort: "", reverse: false, page: 1, pageSize: 50, filter: "" };
}

function listURL(name) {
  const l = LISTS[name], st = state[name];
  const cols = new Set();
  for (const c of l.columns) for (const k of c.fetch || [c.key]) cols.add(k);
  const q = new URLSearchParams({ columns: [...cols].join(","), page: st.page, page_size: st.pageSize });
  if (st.sort) q.set("sort", st.sort);
  if (st.reverse) q.set("sort_reverse", "true");
  if (st.filter) q.set("name", st.filter);
  return l.path + "?" + q.toString();
}

function renderHead(name) {
  const l = LISTS[name], st = state[name];
  const tr = el("tr");
  for (const c of l.columns) {
    if (c.nosort) { tr.append(el("th", {}, c.label)); continue; }
    const th = el("th", { class: "sortable" + (c.num ? " num" : ""), "data-sort": c.key, title: "sort by " + c.label }, c.label);
    if (st.sort === c.key) th.append(el("span", { class: "arrow" }, st.reverse ? "▼" : "▲"));
    th.addEventListener("click", () => {
      if (st.sort === c.key) st.reverse = !st.reverse;
      else { st.sort = c.key; st.reverse = !!c.num; }
      st.page = 1;
      renderHead(name);
      refreshList(name).catch(showError);
    });
    tr.append(th);
  }
  $("#" + name + "-table thead").replaceChildren(tr);
}

async function refreshList(name) {
  const l = LISTS[name], st = state[name];
  const res = await api(listURL(name));
  if (res.page_count && st.page > res.page_count) {
    st.page = res.page_count;
    return refreshList(name);
  }
  const tbody = $("#" + name + "-table tbody");
  if (!res.items.length) {
    const msg = st.filter ? "Nothing matches \u201c" + st.filter + "\u201d." : l.empty;
    tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: l.columns.length }, msg)));
  } else {
    tbody.replaceChildren(...res.items.map((x) => {
      const tr = el("tr", { "data-name": x.name || x.id });
      for (const c of l.columns) {
        const v = c.render ? c.render(x) : x[c.key];
        tr.append(el("td", { class: (c.cls || "") + (c.num ? " num" : "") }, v));
      }
      return tr;
    }));
  }
  const pager = $("[data-pager=" + name + "]");
  const first = res.filtered_count ? (res.page - 1) * res.page_size + 1 : 0;
  const last = (res.page - 1) * res.page_size + res.item_count;
  const prev = el("button", { type: "button" }, "‹ Prev");
  const next = el("button", { type: "button" }, "Next ›");
  prev.disabled = res.page <= 1;
  next.disabled = res.page >= res.page_count;
  prev.addEventListener("click", () => { st.page--; refreshList(name).catch(showError); });
  next.addEventListener("click", () => { st.page++; refreshList(name).catch(showError); });
  const of = res.filtered_count === res.total_count ? fmtInt(res.total_count) : fmtInt(res.filtered_count) + " (of " + fmtInt(res.total_count) + ")";
  pager.replaceChildren(el("span", {}, first + "–" + last + " of " + of), prev, next);
}

// ---- tabs and polling ----

// route reads the hash: a list (#queues), a detail page
// (#queue/NAME, #exchange/NAME), the users page or the overview.
function route() {
  const h = location.hash.replace("#", "");
  const slash = h.indexOf("/");
  if (slash > 0) {
    const kind = h.slice(0, slash), name = decodeURIComponent(h.slice(slash + 1));
    if ((kind === "queue" || kind === "exchange") && name) return { tab: "detail", kind, name };
  }
  if (LISTS[h] || h === "users") return { tab: h };
  return { tab: "overview" };
}

function currentTab() { return route().tab; }

function showTab() {
  const r = route();
  const t = r.tab;
  const navTab = t === "detail" ? r.kind + "s" : t;
  for (const a of $$("nav a")) a.classList.toggle("active", a.dataset.tab === navTab);
  for (const s of $$("[data-tab-panel]")) s.hidden = s.dataset.tabPanel !== t;
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  const t = currentTab();
  try {
    await refreshOverview(t === "overview");
    if (LISTS[t]) await refreshList(t);
    if (t === "detail") await refreshDetail(route());
    if (t === "users") await refreshUsers();
    showError(null);
    $("#last-update").textContent = new Date().toLocaleTimeString();
  } catch (err) {
    showError(err);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function init() {
  $("#refresh-every").textContent = REFRESH_MS / 1000;
  for (const name of Object.keys(LISTS)) {
    renderHead(name);
    const input = $("[data-filter=" + name + "]");
    let debounce = null;
    input.addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => {
        state[name].filter = input.value.trim();
        state[name].page = 1;
        refreshList(name).catch(showError);
      }, 200);
    });
    const size = $("[data-page-size=" + name + "]");
    size.addEventListener("change", () => {
      state[name].pageSize = Number(size.value);
      state[name].page = 1;
      refreshList(name).catch(showError);
    });
  }
  initActions();
  whoami().catch(showError);
  window.addEventListener("hashchange", () => { showTab(); refresh(); });
  let resized = null;
  window.addEventListener("resize", () => { clearTimeout(resized); resized = setTimeout(refresh, 150); });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  showTab();
  refresh();
}

// ---- detail pages: one exchange or one queue ----

const EXCHANGE_RATES = [
  { key: "publish", name: "Publish", color: "#f97316" },
  { key: "request", name: "Request", color: "#2563eb" },
];
const QUEUE_RATES = [
  { key: "publish", name: "Publish", color: "#f97316" },
  { key: "deliver", name: "Deliver", color: "#16a34a" },
  { key: "ack", name: "Ack", color: "#64748b" },
];

// detail is what the open detail page has seen since it opened: its
// charts start with the page (the server keeps history node-wide only).
let detail = { key: "", points: [] };

function card(label, value, id) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label), el("div", { class: "value", id: id }, value));
}

function kvRows(rows) {
  $("#detail-table tbody").replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
}

function muted(text) { return el("span", { class: "muted" }, text); }

// getJSON is api() that answers null for a 404.
async function getJSON(path) {
  try {
    return await api(path);
  } catch (err) {
    if (/: 404 /.test(err.message)) return null;
    throw err;
  }
}

async function refreshDetail(r) {
  const key = r.kind + "/" + r.name;
  if (detail.key !== key) {
    detail = { key, points: [] };
    $("#get-result").replaceChildren();
    $("#legend-detail-rates").replaceChildren();
    $("#legend-detail-depth").replaceChildren();
  }
  const isQueue = r.kind === "queue";
  $("#detail-back").textContent = isQueue ? "Queues" : "Exchanges";
  $("#detail-back").href = isQueue ? "#queues" : "#exchanges";
  $("#detail-kind").textContent = isQueue ? "Queue" : "Exchange";
  $("#detail-name").textContent = r.name;
  $("#detail-depth-panel").hidden = !isQueue;
  $("#queue-actions").hidden = !isQueue;
  $("#purge-button").hidden = !isQueue;
  $("#delete-button").textContent = isQueue ? "Delete queue" : "Delete exchange";

  // A queue is a task exchange's (or a durable subscription's): its
  // workers are that exchange's members.
  const ex = await getJSON("/api/exchanges/" + enc(r.name));
  const q = isQueue ? await getJSON("/api/queues/" + enc(r.name)) : null;
  const gone = isQueue ? !q : !ex;
  $("#tab-detail").classList.toggle("gone", gone);
  if (gone) {
    $("#detail-cards").replaceChildren(card("Status", "not found", "detail-status"));
    kvRows([["Name", r.name], ["Status", (isQueue ? "no queue" : "no exchange") + " of this name"]]);
    $("#detail-members tbody").replaceChildren();
    return;
  }
  const now = Date.now();
  const series = isQueue ? QUEUE_RATES : EXCHANGE_RATES;
  const stats = (isQueue ? q : ex).message_stats;
  const pt = { t: now };
  for (const s of series) pt[s.key] = stats[s.key + "_details"].rate;
  if (isQueue) { pt.ready = q.messages_ready; pt.unacked = q.messages_unacknowledged; }
  detail.points.push(pt);
  while (detail.points.length && detail.points[0].t < now - CHART_AGE * 1000) detail.points.shift();
  const span = chartSpan(now - detail.points[0].t);
  drawChart($("#chart-detail-rates"), series.map((s) => ({ ...s, points: detail.points.map((p) => [p.t, p[s.key]]) })), span, now);
  const rates = {}, totals = {};
  for (const s of series) { rates[s.key] = fmtRate(stats[s.key + "_details"].rate); totals[s.key] = fmtInt(stats[s.key]) + " total"; }
  legend($("#legend-detail-rates"), series, "detail-rate-", rates, totals);

  if (isQueue) {
    drawChart($("#chart-detail-depth"), QUEUED_SERIES.map((s, i) => ({ ...s, points: detail.points.map((p) => [p.t, i ? p.unacked : p.ready]) })), span, now);
    legend($("#legend-detail-depth"), QUEUED_SERIES, "detail-depth-", { messages_ready: fmtInt(q.messages_ready), messages_unacknowledged: fmtInt(q.messages_unacknowledged) });
    $("#detail-cards").replaceChildren(
      card("Messages", fmtInt(q.messages), "detail-messages"),
      card("Ready", fmtInt(q.messages_ready), "detail-ready"),
      card("Unacknowledged", fmtInt(q.messages_unacknowledged), "detail-unacked"),
      card("Consumers", fmtInt(q.consumers), "detail-consumers"),
      card("Memory", fmtBytes(q.memory), "detail-memory"),
      card("Publish", fmtRate(q.message_stats.publish_details.rate), "detail-publish-rate"));
  } else {
    $("#detail-cards").replaceChildren(
      card("Pattern", ex.pattern, "detail-pattern"),
      card("Members", fmtInt(ex.members.length), "detail-member-count"),
      card("Subscribers", fmtInt(ex.subscribers), "detail-subscribers"),
      card("Requests", fmtRate(ex.message_stats.request_details.rate), "detail-request-rate"),
      card("Publishes", fmtRate(ex.message_stats.publish_details.rate), "detail-publish-rate"));
  }
  const rows = [];
  if (ex) {
    rows.push(["Pattern", tag(ex.pattern, ex.pattern)], ["Strategy", ex.strategy || muted("–")],
      ["Key expression", ex.key_expr || muted("none")], ["Route expression", ex.route_expr || muted("none")],
      ["Controlled", ex.controlled ? "yes" : "no"], ["Leader", ex.leader || muted("none")]);
  }
  if (isQueue) {
    rows.push(["Published", fmtInt(q.message_stats.publish)], ["Delivered", fmtInt(q.message_stats.deliver)], ["Acknowledged", fmtInt(q.message_stats.ack)]);
    rows.push(["Type", tag(q.type, q.type)]);
    if (q.type === "quorum") {
      rows.push(["Leader node", q.leader || muted("none")]);
      for (const m of q.replicas) {
        const behind = m.behind === null ? "lag unknown" : fmtInt(m.behind) + " behind";
        rows.push(["Replica " + m.node, m.role + ", " + (m.live ? "live" : "down") + ", " + behind]);
      }
      if (q.membership_change) rows.push(["Change", (q.membership_change[0] === "+" ? "adding " : "removing ") + q.membership_change.slice(1)]);
      if (q.replica_error) rows.push(["Note", muted(q.replica_error)]);
    }
  }
  if (ex && !isQueue && ex.pattern !== "tasks") rows.push(["Queue", muted("none")]);
  if (ex && !isQueue && ex.pattern === "tasks") rows.push(["Queue", el("a", { href: "#queue/" + enc(ex.name) }, ex.name)]);
  if (isQueue && ex) rows.push(["Exchange", el("a", { href: "#exchange/" + enc(ex.name) }, ex.name)]);
  kvRows(rows);

  $("#detail-members-title").textContent = isQueue ? "Consumers" : "Members";
  const members = ex ? ex.members : [];
  $("#detail-members-sub").textContent = members.length + (members.length === 1 ? " attached" : " attached");
  $("#detail-members tbody").replaceChildren(...(members.length ? members.map((m) => el("tr", { "data-name": m.id },
    el("td", { class: "mono" }, m.id), el("td", {}, m.role), el("td", {}, m.service_tag || muted("–")),
    el("td", {}, m.conn_tag || muted("–")), el("td", {}, m.id === ex.leader ? tag("leader", "leader") : "")))
    : [el("tr", {}, el("td", { class: "empty", colspan: 5 }, isQueue ? "No consumer attached." : "No member attached."))]));

  const canPublish = ex && (ex.pattern === "pubsub" || ex.pattern === "tasks");
  $("#publish-form").hidden = !canPublish;
  $("#publish-sub").textContent = ex && ex.pattern === "tasks" ? "submitted as a task, confirmed" : "to the subscribers whose patterns match the key";
  $("#publish-priority").parentElement.hidden = !(ex && ex.pattern === "tasks");
}

// parseHeaders reads "a=1, b=2".
function parseHeaders(text) {
  const h = {};
  for (const part of text.split(",")) {
    const i = part.indexOf("=");
    if (i > 0) h[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return h;
}

function renderGot(msgs) {
  const out = $("#get-result");
  if (!msgs.length) {
    out.replaceChildren(el("p", { class: "muted" }, "The queue has no message ready."));
    return;
  }
  out.replaceChildren(...msgs.map((m, i) => el("div", { class: "message", "data-index": i },
    el("div", { class: "message-head" },
      el("b", {}, "Message " + (i + 1)), " · id " + m.properties.message_id + " · " + fmtInt(m.payload_bytes) + " bytes",
      m.routing_key ? " · key " + m.routing_key : "", m.properties.priority ? " · priority " + m.properties.priority : "",
      m.redelivered ? " · attempts " + m.properties.attempts : "",
      Object.keys(m.properties.headers).length ? " · headers " + Object.entries(m.properties.headers).map(([k, v]) => k + "=" + v).join(", ") : ""),
    el("pre", { class: "payload" + (m.payload_encoding === "base64" ? " base64" : "") },
      m.payload + (m.truncated ? " …" : ""), m.payload_encoding === "base64" ? el("span", { class: "muted" }, "  (base64)") : null))));
}

// ---- users and permissions (administrators) ----

let me = null;

async function whoami() {
  me = await api("/api/whoami");
  const admin = me.anonymous || me.tags.includes("administrator");
  $("#nav-users").hidden = !admin;
  document.body.classList.toggle("read-only", !admin);
}

const patterns = (list) => list && list.length ? list.join(", ") : muted("none");
const splitPatterns = (text) => text.split(",").map((x) => x.trim()).filter((x) => x);

async function refreshUsers() {
  let users;
  try {
    users = await api("/api/users");
  } catch (err) {
    if (/: 501 /.test(err.message)) {
      $("#users-table tbody").replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: 6 }, "This node keeps no users.")));
      return;
    }
    throw err;
  }
  const tb = $("#users-table tbody");
  if (!users.length) {
    tb.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: 6 }, "No users: the API and the client port are open to anyone on this machine. Add an administrator to close them.")));
  } else {
    tb.replaceChildren(...users.map((u) => {
      const del = el("button", { type: "button", class: "small danger", "data-delete-user": u.name }, "Delete");
      const edit = el("button", { type: "button", class: "small", "data-edit-user": u.name }, "Edit");
      const p = u.permissions || {};
      return el("tr", { "data-name": u.name }, el("td", { class: "name" }, u.name),
        el("td", {}, ...(u.tags.length ? u.tags.map((t) => tag(t, t)) : [muted("none")])),
        el("td", { class: "mono" }, patterns(p.configure)), el("td", { class: "mono" }, patterns(p.write)), el("td", { class: "mono" }, patterns(p.read)),
        el("td", { class: "num" }, edit, " ", del));
    }));
  }
  const sel = $("#perm-user");
  const chosen = sel.value;
  sel.replaceChildren(...users.map((u) => el("option", { value: u.name }, u.name)));
  if (users.some((u) => u.name === chosen)) sel.value = chosen;
  sel.dataset.users = JSON.stringify(users.map((u) => [u.name, u.permissions || {}]));
}

function fillPermissions(name) {
  const users = JSON.parse($("#perm-user").dataset.users || "[]");
  const u = users.find((x) => x[0] === name);
  if (!u) return;
  $("#perm-user").value = name;
  $("#perm-configure").value = (u[1].configure || []).join(", ");
  $("#perm-write").value = (u[1].write || []).join(", ");
  $("#perm-read").value = (u[1].read || []).join(", ");
}

// ---- actions ----

// act runs an action, shows its outcome and refreshes the page.
async function act(what, fn) {
  try {
    const msg = await fn();
    notify(msg || what + ": done");
  } catch (err) {
    notify(what + " failed: " + err.message, true);
  }
  refresh();
}

function initActions() {
  $("#publish-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const r = route();
    const body = { routing_key: $("#publish-key").value, payload: $("#publish-payload").value, payload_encoding: "string",
      properties: { headers: parseHeaders($("#publish-headers").value), priority: Number($("#publish-priority").value) || 0 } };
    act("Publish", async () => {
      const res = await send("POST", "/api/exchanges/" + enc(r.name) + "/publish", body);
      if (res.id) return "Published: task " + res.id + " stored in " + r.name + ".";
      return res.routed ? "Published: routed to the matching subscribers." : "Published, but no subscriber matched the key: the message was dropped.";
    });
  });
  $("#get-button").addEventListener("click", () => {
    const r = route();
    act("Get messages", async () => {
      const msgs = await send("POST", "/api/queues/" + enc(r.name) + "/get",
        { count: Number($("#get-count").value) || 1, ackmode: "ack_requeue_true", encoding: "auto", truncate: 50000 });
      renderGot(msgs);
      return msgs.length + (msgs.length === 1 ? " message shown; it stays" : " messages shown; they stay") + " in the queue.";
    });
  });
  $("#purge-button").addEventListener("click", async () => {
    const r = route();
    if (!await confirmAction("Purge " + r.name + "?", "Every ready message of queue " + r.name + " is dropped, for good. Messages being processed stay.", "Purge")) return;
    act("Purge", async () => {
      const res = await send("DELETE", "/api/queues/" + enc(r.name) + "/contents");
      return "Purged " + fmtInt(res.message_count) + " messages from " + r.name + ".";
    });
  });
  $("#delete-button").addEventListener("click", async () => {
    const r = route();
    const what = r.kind === "queue" ? "queue" : "exchange";
    if (!await confirmAction("Delete " + what + " " + r.name + "?", "The " + what + " and every message it holds are deleted, for good; its members are detached.", "Delete")) return;
    act("Delete", async () => {
      await send("DELETE", "/api/" + what + "s/" + enc(r.name));
      location.hash = "#" + what + "s";
      return "Deleted " + what + " " + r.name + ".";
    });
  });
  $("#connections-table").addEventListener("click", async (e) => {
    const b = e.target.closest("[data-close]");
    if (!b) return;
    const id = b.dataset.close;
    if (!await confirmAction("Close connection " + id + "?", "The client is disconnected; its attachments leave their exchanges and its requests in flight are cancelled.", "Close")) return;
    act("Close", async () => {
      await send("DELETE", "/api/connections/" + enc(id));
      return "Closed connection " + id + ".";
    });
  });
  $("#user-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const name = $("#user-name").value.trim();
    const body = { tags: $("#user-tags").value };
    if ($("#user-password").value) body.password = $("#user-password").value;
    act("Save user", async () => {
      await send("PUT", "/api/users/" + enc(name), body);
      $("#user-password").value = "";
      return "Saved user " + name + ".";
    });
  });
  $("#perm-user").addEventListener("change", () => fillPermissions($("#perm-user").value));
  $("#perm-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const name = $("#perm-user").value;
    const body = { configure: splitPatterns($("#perm-configure").value), write: splitPatterns($("#perm-write").value), read: splitPatterns($("#perm-read").value) };
    act("Set permissions", async () => {
      await send("PUT", "/api/permissions/" + enc(name), body);
      return "Set the permissions of " + name + ".";
    });
  });
  $("#users-table").addEventListener("click", async (e) => {
    const edit = e.target.closest("[data-edit-user]");
    if (edit) {
      const name = edit.dataset.editUser;
      $("#user-name").value = name;
      fillPermissions(name);
      return;
    }
    const del = e.target.closest("[data-delete-user]");
    if (!del) return;
    const name = del.dataset.deleteUser;
    if (!await confirmAction("Delete user " + name + "?", "The user can no longer log in; its open connections stay until they close.", "Delete")) return;
    act("Delete user", async () => {
      await send("DELETE", "/api/users/" + enc(name));
      return "Deleted user " + name + ".";
    });
  });
}

init();
