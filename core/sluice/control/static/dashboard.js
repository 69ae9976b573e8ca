// The sluice dashboard: polls the job's control endpoint once a second and draws SVG (no libraries).
// Every bar of a checkpoint plot is a <g data-checkpoint="ID">, so what is drawn can be checked.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PHASES = [
  ["alignment_s", "alignment", "#e8a33d"],
  ["sync_s", "sync", "#c0504d"],
  ["async_s", "async", "#4f81bd"],
  ["other_s", "rest", "#9bbb59"],
];
const MODES = [["aligned", "#4f81bd"], ["unaligned", "#e8a33d"], ["switched", "#8064a2"], ["failed", "#c0392b"]];
const state = { graph: null, busy: false };

function el(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function num(n) {
  if (n === null || n === undefined) return "-";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(0) + "k";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + "k";
  return n >= 10 ? n.toFixed(0) : n.toFixed(1);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}

function secs(s) {
  if (s === null || s === undefined) return "-";
  return s >= 1 ? s.toFixed(2) + " s" : (s * 1000).toFixed(1) + " ms";
}

// a watermark (epoch milliseconds, the minimum over the vertex's subtasks) as UTC date and time
function eventTime(ms) {
  if (ms === null || ms === undefined) return "none yet";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}
function pct(x) { return x === undefined ? "-" : Math.round(x * 100) + "%"; }

// Paths are relative to the session's address (/s/<session>/), where its cookie is valid.
async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin" }, options || {});
  if (opts.method === "POST") {
    opts.headers = { "X-Sluice-Request": "1", "Content-Type": "application/json" };
  }
  const r = await fetch(path, opts);
  if (r.status === 401) {
    location.replace("/login"); // the session ended: log in again
    throw new Error("the session ended");
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

// -- header and actions -------------------------------------------------------------------------------
function renderHeader(job) {
  document.title = "sluice: " + job.job_id;
  document.getElementById("job-id").textContent = job.job_id;
  const badge = document.getElementById("status");
  badge.textContent = job.status;
  badge.className = "badge " + job.status;
  const up = Math.round(job.uptime_s);
  const uptime = up >= 3600 ? Math.floor(up / 3600) + "h" + Math.floor((up % 3600) / 60) + "m"
    : up >= 60 ? Math.floor(up / 60) + "m" + (up % 60) + "s" : up + "s";
  document.getElementById("meta").textContent =
    `${job.runtime} runtime · attempt ${job.attempt ?? "-"} · ${job.restarts} restart(s) · up ${uptime}` +
    ` · checkpoints in ${job.checkpoint_storage}`;
  const running = job.status === "running";
  for (const id of ["btn-savepoint", "btn-stop", "btn-stop-drain", "btn-cancel"]) {
    document.getElementById(id).disabled = !running || state.busy;
  }
  renderFailures(job);
}

function action(id, label, path, body) {
  document.getElementById(id).addEventListener("click", async () => {
    if (id !== "btn-savepoint" && !window.confirm(label + "?")) return;
    const out = document.getElementById("action-result");
    state.busy = true;
    out.textContent = label + "…";
    try {
      const r = await api(path, { method: "POST", body: JSON.stringify(body || {}) });
      out.textContent = label + ": " + (r.path || r.stopped_at || r.status || "done");
    } catch (e) {
      out.textContent = label + " failed: " + e.message;
    } finally {
      state.busy = false;
    }
  });
}

// -- job graph -----------------------------------------------------------------------------------------
function renderGraph(graph, metrics) {
  const svg = clear(document.getElementById("graph"));
  const byId = new Map(graph.vertices.map((v) => [v.id, v]));
  const mById = new Map((metrics ? metrics.vertices : []).map((v) => [v.id, v]));
  const depth = new Map();
  const depthOf = (v) => {
    if (!depth.has(v.id)) depth.set(v.id, v.inputs.length ? 1 + Math.max(...v.inputs.map((e) => depthOf(byId.get(e.from)))) : 0);
    return depth.get(v.id);
  };
  const columns = [];
  for (const v of graph.vertices) (columns[depthOf(v)] = columns[depthOf(v)] || []).push(v);
  const W = 250, H = 112, GX = 70, GY = 24;
  const pos = new Map();
  columns.forEach((col, c) => col.forEach((v, r) => pos.set(v.id, { x: 10 + c * (W + GX), y: 10 + r * (H + GY) })));
  const rows = Math.max(...columns.map((c) => c.length));
  svg.setAttribute("viewBox", `0 0 ${20 + columns.length * (W + GX) - GX} ${20 + rows * (H + GY) - GY}`);
  svg.setAttribute("height", 20 + rows * (H + GY) - GY);
  for (const v of graph.vertices) {
    for (const e of v.inputs) {
      const a = pos.get(e.from), b = pos.get(v.id);
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      svg.appendChild(el("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, class: "edge" }));
      svg.appendChild(el("text", { x: mx, y: (y1 + y2) / 2 - 4, class: "edge-label", "text-anchor": "middle" }, e.partitioning));
    }
  }
  for (const v of graph.vertices) {
    const p = pos.get(v.id), m = mById.get(v.id) || { rates: {}, totals: {} };
    const r = m.rates || {}, t = m.totals || {};
    const g = el("g", { class: "vertex", "data-vertex": v.id, transform: `translate(${p.x},${p.y})` });
    g.appendChild(el("title", {}, v.name));
    g.appendChild(el("rect", { width: W, height: H, rx: 6, class: "box" }));
    const name = v.name.length > 34 ? v.name.slice(0, 33) + "…" : v.name;
    g.appendChild(el("text", { x: 10, y: 20, class: "vname" }, name));
    // a sink emits nothing downstream: what it writes is its rate (rows handed to the sink's writers)
    const out = v.sink ? `written ${num(r.sink_records_per_s)}/s` : `out ${num(r.records_out_per_s)}/s`;
    g.appendChild(el("text", { x: 10, y: 42, class: "vstat" },
      `×${v.parallelism} · in ${num(r.records_in_per_s)}/s · ${out} · ${num(t.records_in)} total`));
    const lag = (t.gauges || {}).kafka_lag_records;
    const extra = lag !== undefined ? ` · lag ${num(lag)}` : "";
    g.appendChild(el("text", { x: 10, y: 62, class: "vstat" }, `busy ${pct(r.busy)} · backpressured ${pct(r.backpressured)}${extra}`));
    g.appendChild(el("text", { x: 10, y: 82, class: "vstat vwatermark" }, `watermark ${eventTime(t.watermark)}`));
    const bp = r.backpressured || 0;
    g.appendChild(el("rect", { x: 10, y: 90, width: W - 20, height: 12, rx: 3, class: "bp-track" }));
    g.appendChild(el("rect", { x: 10, y: 90, width: Math.max(0, (W - 20) * bp), height: 12, rx: 3,
      class: "bp " + (bp > 0.5 ? "high" : bp > 0.1 ? "mid" : "low") }));
    svg.appendChild(g);
  }
}

// -- plots ---------------------------------------------------------------------------------------------
function axes(svg, w, h, max, fmt) {
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.appendChild(el("line", { x1: 50, y1: h - 20, x2: w - 5, y2: h - 20, class: "axis" }));
  svg.appendChild(el("line", { x1: 50, y1: 8, x2: 50, y2: h - 20, class: "axis" }));
  svg.appendChild(el("text", { x: 46, y: 14, class: "tick", "text-anchor": "end" }, fmt(max)));
  svg.appendChild(el("text", { x: 46, y: h - 20, class: "tick", "text-anchor": "end" }, fmt(0)));
}

// bars: one group per checkpoint, stacked segments [{value, color, label}]
function barPlot(id, checkpoints, segmentsOf, fmt) {
  const svg = clear(document.getElementById(id));
  const w = 560, h = 170, n = Math.max(checkpoints.length, 1);
  const stacks = checkpoints.map((c) => ({ c, segs: segmentsOf(c) }));
  const max = Math.max(1e-9, ...stacks.map((s) => s.segs.reduce((a, x) => a + x.value, 0)));
  axes(svg, w, h, max, fmt);
  const slot = (w - 60) / n, bw = Math.max(2, Math.min(24, slot * 0.7));
  stacks.forEach(({ c, segs }, i) => {
    const g = el("g", { "data-checkpoint": c.checkpoint_id, "data-status": c.status, class: "bar" });
    let y = h - 20;
    const x = 55 + i * slot + (slot - bw) / 2;
    for (const s of segs) {
      const bh = ((h - 28) * s.value) / max;
      y -= bh;
      g.appendChild(el("rect", { x, y, width: bw, height: Math.max(bh, 0), fill: s.color }));
    }
    const total = segs.reduce((a, x) => a + x.value, 0);
    g.appendChild(el("title", {}, `checkpoint ${c.checkpoint_id} (${c.status}): ` +
      segs.map((s) => `${s.label} ${fmt(s.value)}`).join(", ") + (segs.length > 1 ? `; total ${fmt(total)}` : "")));
    if (n <= 30 || i % Math.ceil(n / 30) === 0) {
      g.appendChild(el("text", { x: x + bw / 2, y: h - 6, class: "tick", "text-anchor": "middle" }, c.checkpoint_id));
    }
    svg.appendChild(g);
  });
}

function durationSegments(c) {
  if (c.status !== "completed") return [{ value: c.duration_s || 0, color: "#c0392b", label: c.status }];
  const ph = c.phases || {};
  let parts = PHASES.slice(0, 3).map(([k, label, color]) => ({ value: ph[k] || 0, color, label }));
  const sum = parts.reduce((a, x) => a + x.value, 0);
  const total = c.duration_s || 0;
  if (sum > total && sum > 0) parts = parts.map((p) => Object.assign(p, { value: (p.value * total) / sum }));
  parts.push({ value: Math.max(0, total - Math.min(sum, total)), color: PHASES[3][2], label: "rest" });
  return parts;
}

function modeOf(c) {
  if (c.status === "failed") return "failed";
  if (c.switched_to_unaligned) return "switched";
  return c.unaligned ? "unaligned" : "aligned";
}

function alignmentStrip(checkpoints) {
  const svg = clear(document.getElementById("plot-alignment"));
  const w = 560, h = 60, n = Math.max(checkpoints.length, 1), slot = (w - 60) / n;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const colors = Object.fromEntries(MODES);
  checkpoints.forEach((c, i) => {
    const mode = modeOf(c);
    const g = el("g", { "data-checkpoint": c.checkpoint_id, "data-mode": mode, class: "bar" });
    g.appendChild(el("rect", { x: 55 + i * slot, y: 8, width: Math.max(1, slot - 1), height: 30, fill: colors[mode] }));
    g.appendChild(el("title", {}, `checkpoint ${c.checkpoint_id}: ${mode}` + (c.failure_reason ? ` (${c.failure_reason})` : "")));
    svg.appendChild(g);
  });
}

function throughputPlot(points) {
  const svg = clear(document.getElementById("plot-throughput"));
  const w = 1140, h = 150;
  const max = Math.max(1, ...points.map((p) => Math.max(p.read_per_s, p.written_per_s)));
  axes(svg, w, h, max, (v) => num(v) + "/s");
  if (points.length < 2) return;
  const t0 = points[0].time, span = Math.max(1, points[points.length - 1].time - t0);
  const line = (key, cls) => {
    const d = points.map((p) => `${55 + ((w - 65) * (p.time - t0)) / span},${h - 20 - ((h - 28) * p[key]) / max}`).join(" ");
    svg.appendChild(el("polyline", { points: d, class: "line " + cls }));
  };
  line("read_per_s", "read");
  line("written_per_s", "written");
  svg.appendChild(el("text", { x: 60, y: 14, class: "tick" }, "blue: read · green: written"));
}

function legend(id, items) {
  const span = document.getElementById(id);
  if (span.childNodes.length) return;
  for (const [label, color] of items) {
    const s = document.createElement("span");
    s.className = "key";
    s.style.setProperty("--c", color);
    s.textContent = label;
    span.appendChild(s);
  }
}

function renderCheckpoints(data) {
  const hist = data.history.filter((c) => c.status !== "in_progress").slice(-60);
  const counts = data.counts || {};
  document.getElementById("checkpoint-counts").textContent =
    `${counts.completed || 0} completed, ${counts.failed || 0} failed, ${counts.in_progress || 0} in progress`;
  legend("legend-duration", PHASES.map(([, label, color]) => [label, color]).concat([["failed", "#c0392b"]]));
  legend("legend-alignment", MODES);
  barPlot("plot-duration", hist, durationSegments, secs);
  barPlot("plot-size", hist, (c) => [{ value: c.state_bytes || 0, color: "#4f81bd", label: "state" }], bytes);
  barPlot("plot-inflight", hist, (c) => [{ value: c.inflight_bytes || 0, color: "#e8a33d", label: "in-flight" }], bytes);
  alignmentStrip(hist);
  const body = document.querySelector("#checkpoints tbody");
  body.replaceChildren();
  for (const c of hist.slice(-10).reverse()) {
    const tr = document.createElement("tr");
    tr.className = c.status;
    const ph = c.phases || {};
    const cells = [c.checkpoint_id, c.status, c.kind, modeOf(c), secs(c.duration_s),
      `${secs(ph.alignment_s)} / ${secs(ph.sync_s)} / ${secs(ph.async_s)}`, bytes(c.state_bytes || 0),
      bytes(c.inflight_bytes || 0), c.failure_reason ? `${c.failure_reason}: ${c.failure_detail || ""}` : ""];
    for (const v of cells) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function renderFailures(job) {
  const ul = document.getElementById("failures");
  ul.replaceChildren();
  const items = job.failures.map((f) => `attempt ${f.attempt} failed: ${f.error}`);
  if (job.last_failed_checkpoint) {
    const c = job.last_failed_checkpoint;
    items.push(`checkpoint ${c.checkpoint_id} failed: ${c.failure_reason}: ${c.failure_detail || ""}`);
  }
  for (const text of items.length ? items : ["none"]) {
    const li = document.createElement("li");
    li.textContent = text;
    if (!items.length) li.className = "none";
    ul.appendChild(li);
  }
}

async function refresh() {
  try {
    if (!state.graph) state.graph = await api("api/v1/graph");
    const [job, metrics, checkpoints] = await Promise.all([
      api("api/v1/job"), api("api/v1/metrics"), api("api/v1/checkpoints?limit=60"),
    ]);
    renderHeader(job);
    renderGraph(state.graph, metrics);
    throughputPlot(metrics.throughput || []);
    renderCheckpoints(checkpoints);
    document.body.dataset.loaded = "1";
  } catch (e) {
    document.getElementById("action-result").textContent = "the job's endpoint does not answer: " + e.message;
  }
}

action("btn-savepoint", "Savepoint", "api/v1/savepoint");
action("btn-stop", "Stop with a savepoint", "api/v1/stop", { savepoint: true, drain: false });
action("btn-stop-drain", "Stop and drain", "api/v1/stop", { savepoint: true, drain: true });
action("btn-cancel", "Cancel the job", "api/v1/cancel");
document.getElementById("btn-logout").addEventListener("click", async () => {
  await api("logout", { method: "POST" }).catch(() => null);
  location.replace("/login");
});
refresh();
setInterval(refresh, 1000);
