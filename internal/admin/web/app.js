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

const queuedHistory = [];

async function refreshOverview(full) {
  const path = full ? "/api/overview?msg_rates_age=" + CHART_AGE + "&msg_rates_incr=" + CHART_INCR : "/api/overview";
  const o = await api(path);
  $("#node-name").textContent = o.node;
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

  queuedHistory.push([now, o.queue_totals.messages_ready, o.queue_totals.messages_unacknowledged]);
  while (queuedHistory.length && queuedHistory[0][0] < now - CHART_AGE * 1000) queuedHistory.shift();
  const queued = QUEUED_SERIES.map((s, i) => ({ ...s, points: queuedHistory.map((h) => [h[0], h[1 + i]]) }));
  drawChart($("#chart-queued"), queued, chartSpan(now - queuedHistory[0][0]), now);
  legend($("#legend-queued"), QUEUED_SERIES, "queued-", {
    messages_ready: fmtInt(o.queue_totals.messages_ready),
    messages_unacknowledged: fmtInt(o.queue_totals.messages_unacknowledged),
  });

  const nodes = await api("/api/nodes");
  const n = nodes[0];
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

const tag = (cls, text) => el("span", { class: "tag " + cls }, text);

const LISTS = {
  exchanges: {
    path: "/api/exchanges",
    empty: "No exchanges. Create one with `courier exchanges create <name>` or PUT /api/exchanges/<name>.",
    columns: [
      { key: "name", label: "Name", cls: "name" },
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
      { key: "name", label: "Name", cls: "name" },
      { key: "messages", label: "Messages", num: true, render: (x) => fmtInt(x.messages) },
      { key: "messages_ready", label: "Ready", num: true, render: (x) => fmtInt(x.messages_ready) },
      { key: "messages_unacknowledged", label: "Unacked", num: true, render: (x) => fmtInt(x.messages_unacknowledged) },
      { key: "consumers", label: "Consumers", num: true, render: (x) => fmtInt(x.consumers) },
      { key: "memory", label: "Memory", num: true, render: (x) => fmtBytes(x.memory) },
      { key: "message_stats.publish_details.rate", label: "Publish/s", num: true, render: (x) => fmtRate(x.message_stats.publish_details.rate) },
      { key: "message_stats.deliver_details.rate", label: "Deliver/s", num: true, render: (x) => fmtRate(x.message_stats.deliver_details.rate) },
      { key: "message_stats.ack_details.rate", label: "Ack/s", num: true, render: (x) => fmtRate(x.message_stats.ack_details.rate) },
    ],
  },
  connections: {
    path: "/api/connections",
    empty: "No connections.",
    columns: [
      { key: "id", label: "Id", cls: "mono" },
      { key: "name", label: "Name", cls: "name" },
      { key: "type", label: "Type", render: (x) => tag(x.type, x.type) },
      { key: "peer", label: "Peer", cls: "mono", render: (x) => x.peer || el("span", { class: "muted" }, "in-process") },
      { key: "user", label: "User", render: (x) => x.user || el("span", { class: "muted" }, "–") },
      { key: "attachments", label: "Attachments", num: true, render: (x) => fmtInt(x.attachments) },
      { key: "inflight", label: "In flight", num: true, render: (x) => fmtInt(x.inflight) },
      { key: "connected_at", label: "Connected", render: (x) => el("span", { title: new Date(x.connected_at).toLocaleString() }, fmtSince(x.connected_at)) },
      { key: "message_stats.request_details.rate", label: "Requests/s", num: true, render: (x) => fmtRate(x.message_stats.request_details.rate) },
      { key: "message_stats.publish_details.rate", label: "Publishes/s", num: true, render: (x) => fmtRate(x.message_stats.publish_details.rate) },
      { key: "message_stats.deliver_details.rate", label: "Delivered/s", num: true, render: (x) => fmtRate(x.message_stats.deliver_details.rate) },
      { key: "message_stats.response_details.rate", label: "Responses/s", num: true, render: (x) => fmtRate(x.message_stats.response_details.rate) },
    ],
  },
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

function currentTab() {
  const t = location.hash.replace("#", "");
  return LISTS[t] ? t : "overview";
}

function showTab() {
  const t = currentTab();
  for (const a of $$("nav a")) a.classList.toggle("active", a.dataset.tab === t);
  for (const s of $$("[data-tab-panel]")) s.hidden = s.dataset.tabPanel !== t;
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  const t = currentTab();
  try {
    await refreshOverview(t === "overview");
    if (LISTS[t]) await refreshList(t);
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
  window.addEventListener("hashchange", () => { showTab(); refresh(); });
  let resized = null;
  window.addEventListener("resize", () => { clearTimeout(resized); resized = setTimeout(refresh, 150); });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  showTab();
  refresh();
}

init();
