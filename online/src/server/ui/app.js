// Quiver's web UI: one page over the server's JSON endpoints (/api/registry,
// /api/freshness, /api/statistics/VIEW, /api/verify-reports, /api/monitor-reports,
// /api/lineage, /get-online-features).
// No build step and no library: the charts are SVG drawn here.
"use strict";

const state = { registry: null, token: sessionStorage.getItem("quiver-token") || "" };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children.flat()) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

// Every call carries the token once one is known (kept for the tab's session); a 401
// asks for it, once, in a form above the page.
async function api(path, options) {
  const headers = Object.assign({ "content-type": "application/json" }, (options || {}).headers || {});
  if (state.token) headers.authorization = "Bearer " + state.token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) askForToken();
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(`${path}: ${response.status} ${body.error || ""}`);
  return body;
}

function askForToken() {
  if ($("token-form")) return;
  const input = el("input", { type: "password", id: "token", placeholder: "server.auth_token", size: 40 });
  const form = el("form", { id: "token-form", class: "card" },
    el("h2", { text: "This server needs its token" }), input, " ", el("button", { type: "submit", text: "Use it" }));
  form.onsubmit = (event) => {
    event.preventDefault();
    state.token = input.value;
    sessionStorage.setItem("quiver-token", state.token);
    form.remove();
    start();
  };
  document.querySelector("main").prepend(form);
}

function duration(seconds) {
  if (seconds == null) return "—";
  const s = Math.abs(seconds);
  const text = s < 120 ? `${Math.round(s)}s` : s < 7200 ? `${Math.round(s / 60)}m` : s < 172800 ? `${(s / 3600).toFixed(1)}h` : `${(s / 86400).toFixed(1)}d`;
  return seconds < 0 ? `in ${text}` : text;
}

// ---- registry ------------------------------------------------------------------

function viewKind(v) {
  return (v.aggregations || []).length ? "event log" : "feature view";
}

function renderRegistry() {
  const defs = state.registry.definitions;
  const q = $("search").value.trim().toLowerCase();
  const hit = (...texts) => !q || texts.some((t) => String(t || "").toLowerCase().includes(q));
  const out = $("registry");
  out.replaceChildren();
  for (const e of defs.entities || []) {
    if (!hit(e.name, e.description, ...(e.join_keys || []).map((k) => k.name))) continue;
    out.append(el("div", { class: "card entity", "data-name": e.name },
      el("h2", {}, e.name, el("span", { class: "kind", text: "entity" })),
      e.description ? el("p", { text: e.description }) : null,
      el("div", {}, "join keys: ", (e.join_keys || []).map((k) => el("span", { class: "tag", text: `${k.name}: ${k.dtype}` })))));
  }
  // Each view's live versions together, oldest first (docs/versions.md).
  const earlier = (defs.earlier_versions && defs.earlier_versions.feature_views) || [];
  const versions = (name) => earlier.filter((e) => e.name === name).concat((defs.feature_views || []).filter((v) => v.name === name))
    .sort((a, b) => (a.version || 1) - (b.version || 1));
  for (const latest of defs.feature_views || []) {
    const live = versions(latest.name);
    for (const v of live) {
      const features = v.features || [], aggs = v.aggregations || [];
      if (!hit(v.name, v.description, ...features.map((f) => f.name), ...aggs.map((a) => a.name))) continue;
      const version = v.version || 1, label = version === 1 ? v.name : `${v.name}@${version}`;
      const source = Object.entries(v.source || {}).map(([k, x]) => el("span", { class: "tag", text: `${k}: ${typeof x === "object" ? JSON.stringify(x) : x}` }));
      const rows = features.map((f) => el("tr", {}, el("td", { class: "mono", text: f.name }), el("td", { text: f.dtype }), el("td", { text: aggs.length ? "event column" : "served" })));
      const aggRows = aggs.map((a) => el("tr", {}, el("td", { class: "mono", text: a.name }),
        el("td", { text: `${a.function}(${a.column})${a.k ? " k=" + a.k : ""}` }),
        el("td", { text: `window ${a.window}, hop ${a.hop || a.default_hop + " (default)"}` })));
      out.append(el("div", { class: "card view", "data-name": label },
        el("h2", {}, label, el("span", { class: "kind", text: viewKind(v) }),
          live.length > 1 ? el("span", { class: "tag version", text: `version ${version}${v === latest ? " (latest)" : ""} of ${live.map((x) => x.version || 1).join(", ")}` }) : null),
        v.description ? el("p", { text: v.description }) : null,
        el("div", {}, "entities: ", (v.entities || []).map((x) => el("span", { class: "tag", text: x })),
          ` ttl: ${v.ttl === "0" || v.ttl == null ? "none" : v.ttl}`, v.online === false ? " · offline only" : " · online"),
        el("div", {}, "source: ", source),
        el("table", {}, el("tr", {}, el("th", { text: "feature" }), el("th", { text: "type" }), el("th", { text: "" })), rows, aggRows)));
    }
  }
  const history = state.registry.history || [];
  if (history.length && !q) {
    out.append(el("div", { class: "card versions" }, el("h2", { text: "Registry versions" }),
      el("table", {}, el("tr", {}, ["version", "applied", "changes"].map((t) => el("th", { text: t }))),
        history.slice().reverse().map((h) => el("tr", {}, el("td", { text: h.version }), el("td", { text: h.applied_at }),
          el("td", { class: "mono", text: (h.changes || []).join(", ") + (h.forced ? " (forced)" : "") }))))));
  }
  for (const s of defs.feature_services || []) {
    if (!hit(s.name, s.description, ...(s.features || []))) continue;
    out.append(el("div", { class: "card service", "data-name": s.name },
      el("h2", {}, s.name, el("span", { class: "kind", text: "feature service" })),
      s.description ? el("p", { text: s.description }) : null,
      el("div", {}, (s.features || []).map((f) => el("span", { class: "tag", text: f })))));
  }
  for (const o of defs.on_demand_views || []) {
    const features = o.features || [], request = o.request || [];
    if (!hit(o.name, o.description, ...features.map((f) => f.name), ...features.map((f) => f.expr))) continue;
    out.append(el("div", { class: "card view", "data-name": o.name },
      el("h2", {}, o.name, el("span", { class: "kind", text: "on-demand view" })),
      o.description ? el("p", { text: o.description }) : null,
      el("div", {}, "inputs: ", (o.inputs || []).map((x) => el("span", { class: "tag", text: x }))),
      request.length ? el("div", {}, "request: ", request.map((f) => el("span", { class: "tag", text: `${f.name}: ${f.dtype}` }))) : null,
      el("table", {}, el("tr", {}, el("th", { text: "feature" }), el("th", { text: "type" }), el("th", { text: "expression" })),
        features.map((f) => el("tr", {}, el("td", { class: "mono", text: f.name }), el("td", { text: f.dtype }),
          el("td", { class: "mono", text: f.expr }))))));
  }
}

// ---- lineage: the graph `quiver lineage` answers from ---------------------------------
// Sources -> feature views -> features -> on-demand features -> services -> training
// sets, from /api/lineage. A click on a node keeps what it reads and what reads it.

const LINEAGE_COLUMNS = [["source"], ["feature_view"], ["feature", "request_field"], ["on_demand_view", "on_demand_feature"],
  ["feature_service"], ["training_set"]];
const LINEAGE_FILL = { source: "#f2f4f7", feature_view: "#eef2ff", feature: "#f5f8ff", request_field: "#fdf6ec",
  on_demand_view: "#fff4e5", on_demand_feature: "#fffaf0", feature_service: "#e8f6ee", training_set: "#f3ecfb" };

function lineageAround(graph, id) {
  const keep = new Set([id]);
  for (const forward of [true, false]) {
    const stack = [id];
    while (stack.length) {
      const at = stack.pop();
      for (const e of graph.edges) {
        const [here, next] = forward ? [e.from, e.to] : [e.to, e.from];
        if (here === at && !keep.has(next)) { keep.add(next); stack.push(next); }
      }
    }
  }
  return keep;
}

// `#lineage?node=ID` opens on that node's lineage.
async function renderLineage() {
  const graph = await api("/api/lineage");
  const asked = new URLSearchParams(location.hash.split("?")[1] || "").get("node");
  drawLineage(graph, graph.nodes.some((n) => n.id === asked) ? asked : null);
}

function drawLineage(graph, selected) {
  const keep = selected ? lineageAround(graph, selected) : null;
  const nodes = graph.nodes.filter((n) => !keep || keep.has(n.id));
  const columns = LINEAGE_COLUMNS.map((kinds) => nodes.filter((n) => kinds.includes(n.kind))).filter((c) => c.length);
  const rowH = 34, boxW = 200, gap = 40, width = columns.length * (boxW + gap) + 20;
  const height = Math.max(1, ...columns.map((c) => c.length)) * rowH + 30;
  const at = new Map();
  columns.forEach((c, i) => c.forEach((n, j) => at.set(n.id, { x: 10 + i * (boxW + gap), y: 20 + j * rowH })));
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "lineage-graph" });
  for (const e of graph.edges) {
    const a = at.get(e.from), b = at.get(e.to);
    if (!a || !b) continue;
    const [x1, y1, x2, y2] = [a.x + boxW, a.y + 12, b.x, b.y + 12];
    root.append(svg("path", { d: `M${x1},${y1} C${x1 + 40},${y1} ${x2 - 40},${y2} ${x2},${y2}`, fill: "none", stroke: "#98a2b3" }));
  }
  for (const n of nodes) {
    const p = at.get(n.id);
    const label = n.name.length > 28 ? "…" + n.name.slice(-27) : n.name;
    const g = svg("g", { class: "lineage-node", "data-id": n.id, style: "cursor:pointer" },
      svg("title", {}, `${n.kind}: ${n.name}`),
      svg("rect", { x: p.x, y: p.y, width: boxW, height: 24, rx: 6, fill: LINEAGE_FILL[n.kind] || "#fff",
        stroke: n.id === selected ? "#1d4ed8" : "#d0d5dd", "stroke-width": n.id === selected ? 2 : 1 }),
      svg("text", { x: p.x + 8, y: p.y + 16, style: "fill:#1d2330;font-size:12px" }, label));
    g.onclick = () => drawLineage(graph, n.id === selected ? null : n.id);
    root.append(g);
  }
  const picked = selected && graph.nodes.find((n) => n.id === selected);
  const details = picked ? el("div", { class: "card", id: "lineage-details" }, el("h2", { text: `${picked.kind.replace(/_/g, " ")} ${picked.name}` }),
    el("pre", { class: "mono", text: JSON.stringify(picked.details || {}, null, 2) })) : null;
  const title = selected ? "What it reads and what reads it (click again for everything)" : "Sources → views → features → on-demand → services → training sets";
  $("lineage").replaceChildren(el("div", { class: "card" }, el("h2", { text: title }), el("div", { style: "overflow-x:auto" }, root)), ...(details ? [details] : []));
}

// ---- freshness ---------------------------------------------------------------------

async function renderFreshness() {
  const data = await api("/api/freshness");
  // A view with a ttl: its age on a scale of 1.5 ttl, the ttl marked. Without: against
  // the oldest of those.
  const maxAge = Math.max(1, ...data.views.filter((v) => !v.ttl_seconds).map((v) => v.age_seconds || 0));
  const rows = data.views.map((v) => {
    const w = 220, age = Math.max(0, v.age_seconds || 0), scale = v.ttl_seconds ? 1.5 * v.ttl_seconds : maxAge;
    const bar = svg("svg", { width: w, height: 14, class: "age-bar" },
      svg("rect", { x: 0, y: 2, width: Math.max(2, Math.min(w, (w * age) / scale)), height: 10, rx: 3, fill: v.stale ? "#d0453c" : "#2e9d5b" }),
      v.ttl_seconds ? svg("line", { x1: (w * v.ttl_seconds) / scale, x2: (w * v.ttl_seconds) / scale, y1: 0, y2: 14, stroke: "#1d2330", "stroke-width": 2 }) : null);
    const materialized = (v.materialized || []).map((m) => `${m.store}: until ${m.until} (v${m.table_version})`).join("; ") || "never (incrementally)";
    return el("tr", { class: v.stale ? "stale-row" : "fresh-row", "data-view": v.view },
      el("td", { class: "mono", text: v.view }),
      el("td", { text: v.newest_event || "no rows" }),
      el("td", { class: v.stale ? "stale" : "fresh", text: duration(v.age_seconds) }),
      el("td", { text: v.ttl_seconds ? duration(v.ttl_seconds) : "none" }),
      el("td", {}, bar),
      el("td", { text: `${v.rows.toLocaleString()} rows, version ${v.table_version ?? "—"}` }),
      el("td", { text: materialized }),
      el("td", { class: "stream-lag", text: v.stream ? `${v.stream.topic}: ${v.stream.lag == null ? "not reported" : v.stream.lag + " behind"}` : "—" }));
  });
  const errors = (data.stream_errors || []).map((e) => el("div", { class: "error", text: `stream metrics ${e}` }));
  $("freshness").replaceChildren(el("div", { class: "card" },
    el("h2", { text: `Freshness at ${data.now}` }),
    el("table", {}, el("tr", {}, ["view", "newest event", "age", "ttl", "age against ttl", "offline table", "last materialization", "stream lag"].map((h) => el("th", { text: h }))), rows),
    errors));
}

// ---- statistics --------------------------------------------------------------------

function histogram(h) {
  const w = 260, hgt = 90, n = h.counts.length, top = Math.max(1, ...h.counts);
  const bars = h.counts.map((c, i) => svg("rect", { x: (i * w) / n + 1, y: hgt - (hgt * c) / top, width: w / n - 2, height: (hgt * c) / top, fill: "#3559c7" },
    svg("title", {}, `${c}`)));
  return svg("svg", { width: w, height: hgt + 16, class: "histogram" }, bars,
    svg("text", { x: 0, y: hgt + 13 }, Number(h.lo.toPrecision(4))), svg("text", { x: w, y: hgt + 13, "text-anchor": "end" }, Number(h.hi.toPrecision(4))));
}

async function renderStatistics() {
  const select = $("stats-view");
  if (!select.options.length) {
    for (const v of state.registry.definitions.feature_views || []) select.append(el("option", { value: v.name, text: v.name }));
    select.onchange = () => renderStatistics().catch((e) => showError(e.message));
  }
  if (!select.value) return;
  const data = await api(`/api/statistics/${encodeURIComponent(select.value)}`);
  const charts = data.features.map((f) => el("div", { class: "card feature-stats", "data-feature": f.name },
    el("h2", {}, f.name, el("span", { class: "kind", text: f.dtype })),
    el("div", { text: `null rate ${(100 * f.null_rate).toFixed(1)}% (${f.nulls} of ${data.rows})` }),
    f.histogram ? histogram(f.histogram) : el("div", { class: "muted", text: "no histogram (not numeric)" })));
  $("statistics").replaceChildren(el("p", { text: `${data.rows.toLocaleString()} rows at table version ${data.table_version ?? "—"}` }), el("div", { class: "charts" }, charts));
}

// ---- consistency -------------------------------------------------------------------

async function renderConsistency() {
  const data = await api("/api/verify-reports");
  const reports = data.reports || [];
  if (!reports.length) {
    $("consistency").replaceChildren(el("div", { class: "card", text: "No verify runs yet: `quiver verify --sample N` or `--since T` stores a report here." }));
    return;
  }
  // One line per feature: its mismatch rate at each run.
  const series = {};
  reports.forEach((r, i) => (r.features || []).forEach((f) => { (series[f.feature] = series[f.feature] || []).push([i, f.rate]); }));
  const w = 700, h = 200, pad = 30, top = Math.max(0.01, ...Object.values(series).flat().map((p) => p[1]));
  const x = (i) => pad + (reports.length === 1 ? (w - 2 * pad) / 2 : (i * (w - 2 * pad)) / (reports.length - 1));
  const y = (r) => h - pad - (r * (h - 2 * pad)) / top;
  const colors = ["#3559c7", "#d0453c", "#2e9d5b", "#d99a1e", "#7a5af8", "#0ba5ec", "#ee46bc"];
  const chart = svg("svg", { width: w, height: h, id: "mismatch-chart" },
    svg("line", { x1: pad, x2: w - pad, y1: h - pad, y2: h - pad, stroke: "#d0d5dd" }),
    svg("text", { x: 2, y: pad }, `${(100 * top).toFixed(1)}%`), svg("text", { x: 2, y: h - pad }, "0%"),
    Object.entries(series).map(([name, pts], k) => svg("g", {},
      svg("polyline", { points: pts.map(([i, r]) => `${x(i)},${y(r)}`).join(" "), fill: "none", stroke: colors[k % colors.length], "stroke-width": 2 }),
      pts.map(([i, r]) => svg("circle", { cx: x(i), cy: y(r), r: 3, fill: colors[k % colors.length] }, svg("title", {}, `${name}: ${(100 * r).toFixed(2)}%`))))));
  const rows = reports.slice().reverse().map((r) => el("tr", {},
    el("td", { text: r.at }), el("td", { text: r.kind + (r.since ? ` ${r.since} – ${r.until}` : "") }),
    el("td", { text: (r.features || []).reduce((a, f) => a + f.compared, 0) }),
    el("td", { text: (r.features || []).reduce((a, f) => a + f.mismatches + f.missing_online + f.missing_offline, 0) })));
  $("consistency").replaceChildren(
    el("div", { class: "card" }, el("h2", { text: "Mismatch rate per feature, by verify run" }), chart),
    el("div", { class: "card" }, el("h2", { text: "Runs" }),
      el("table", {}, el("tr", {}, ["at", "kind", "rows compared", "disagreements"].map((t) => el("th", { text: t }))), rows)));
}

// ---- monitoring --------------------------------------------------------------------

// One chart per feature: its PSI and KS in each stored `quiver monitor` report, oldest
// first, against their limits (dashed); a report where the feature crossed a threshold
// is marked red, with what it crossed in the point's title.
function monitorChart(name, points) {
  const w = 340, h = 150, pad = 28;
  const values = points.flatMap((p) => [p.psi, p.ks, p.limits.psi, p.limits.ks]).filter((v) => v != null);
  const top = Math.max(0.05, ...values) * 1.1;
  const x = (i) => pad + (points.length === 1 ? (w - 2 * pad) / 2 : (i * (w - 2 * pad)) / (points.length - 1));
  const y = (v) => h - pad - (v * (h - 2 * pad)) / top;
  const series = [["psi", "#3559c7"], ["ks", "#d99a1e"]];
  return svg("svg", { viewBox: `0 0 ${w} ${h}`, width: "100%", class: "monitor-chart", "data-feature": name },
    svg("line", { x1: pad, x2: w - pad, y1: h - pad, y2: h - pad, stroke: "#d0d5dd" }),
    svg("text", { x: 2, y: pad }, top.toFixed(2)), svg("text", { x: 2, y: h - pad }, "0"),
    series.map(([stat, color]) => {
      const limit = points[points.length - 1].limits[stat];
      const pts = points.map((p, i) => [i, p[stat], p]).filter(([, v]) => v != null);
      return svg("g", {},
        svg("line", { x1: pad, x2: w - pad, y1: y(limit), y2: y(limit), stroke: color, "stroke-dasharray": "4 3", "stroke-width": 1 },
          svg("title", {}, `${stat} limit ${limit}`)),
        svg("polyline", { points: pts.map(([i, v]) => `${x(i)},${y(v)}`).join(" "), fill: "none", stroke: color, "stroke-width": 2 }),
        pts.map(([i, v, p]) => {
          const breach = p.breaches.includes(stat);
          return svg("circle", { cx: x(i), cy: y(v), r: breach ? 5 : 3, fill: breach ? "#d0453c" : color, class: breach ? "breach" : "" },
            svg("title", {}, `${p.at}: ${stat} ${v.toFixed(4)} (limit ${p.limits[stat]})${p.breaches.length ? ` — breach: ${p.breaches.join(", ")}` : ""}`));
        }));
    }));
}

async function renderMonitoring() {
  const data = await api("/api/monitor-reports");
  const reports = data.reports || [];
  if (!reports.length) {
    $("monitoring").replaceChildren(el("div", { class: "card", text: "No monitor runs yet: `quiver monitor --reference ... --current ...` stores a report here." }));
    return;
  }
  const byFeature = {};
  for (const r of reports) {
    for (const f of r.features || []) {
      (byFeature[f.feature] = byFeature[f.feature] || []).push({ ...f, at: r.created_at });
    }
  }
  const cards = Object.entries(byFeature).map(([name, points]) => {
    const last = points[points.length - 1];
    const nulls = (v) => (v == null ? "—" : `${(100 * v).toFixed(1)}%`);
    return el("div", { class: "card" + (last.breaches.length ? " breached" : "") },
      el("h3", { text: name }),
      el("div", { text: last.breaches.length ? `latest: BREACH ${last.breaches.join(", ")}` : "latest: ok" }),
      el("div", { class: "muted", text: `null rate ${nulls(last.null_rate.reference)} → ${nulls(last.null_rate.current)}` +
        (last.not_found_rate != null ? `, not found ${nulls(last.not_found_rate)}` : "") }),
      monitorChart(name, points));
  });
  const rows = reports.slice().reverse().map((r) => el("tr", {},
    el("td", { text: r.created_at }), el("td", { text: r.reference }), el("td", { text: r.current }),
    el("td", { text: (r.features || []).length }),
    el("td", { text: (r.features || []).filter((f) => f.breaches.length).map((f) => f.feature).join(", ") || "none" })));
  $("monitoring").replaceChildren(
    el("p", { class: "muted", text: "PSI (blue) and KS (amber) per feature by monitor run, limits dashed, breaches in red." }),
    el("div", { class: "charts" }, cards),
    el("div", { class: "card" }, el("h2", { text: "Runs" }),
      el("table", {}, el("tr", {}, ["at", "reference", "current", "features", "breached"].map((t) => el("th", { text: t }))), rows)));
}

// ---- lookup ------------------------------------------------------------------------

async function renderLookupForm() {
  const defs = state.registry.definitions;
  const features = $("lookup-features"), keys = $("lookup-keys");
  features.replaceChildren(el("legend", { text: "Features" }));
  keys.replaceChildren(el("legend", { text: "Entity keys" }));
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const wanted = (params.get("features") || "").split(",").filter(Boolean);
  for (const v of defs.feature_views || []) {
    if (v.online === false) continue;
    const names = (v.aggregations || []).length ? v.aggregations.map((a) => a.name) : (v.features || []).map((f) => f.name);
    for (const name of names) {
      const ref = `${v.name}:${name}`;
      const box = el("input", { type: "checkbox", value: ref, "data-view": v.name });
      box.checked = wanted.includes(ref);
      features.append(el("label", {}, box, " ", ref));
    }
  }
  const seen = new Set();
  for (const e of defs.entities || []) for (const k of e.join_keys || []) {
    if (seen.has(k.name)) continue;
    seen.add(k.name);
    keys.append(el("label", {}, `${k.name} (${k.dtype}) `, el("input", { name: k.name, "data-dtype": k.dtype, value: params.get(k.name) || "", size: 12 })));
  }
  $("lookup-form").onsubmit = (event) => { event.preventDefault(); lookup().catch((e) => showError(e.message)); };
  // A link may name the features and keys (#lookup?features=v:f,...&key=value): answer it.
  if (wanted.length) await lookup();
}

async function lookup() {
  const features = [...document.querySelectorAll("#lookup-features input:checked")].map((b) => b.value);
  if (!features.length) throw new Error("choose at least one feature");
  const entities = {};
  for (const input of document.querySelectorAll("#lookup-keys input")) {
    if (!input.value.trim()) continue;
    const values = input.value.split(",").map((s) => s.trim());
    entities[input.name] = input.dataset.dtype.startsWith("int") ? values.map(Number) : values;
  }
  const body = JSON.stringify({ entities, features, full_feature_names: true });
  const origin = location.origin;
  $("lookup-curl").textContent = `curl -s -X POST ${origin}/get-online-features -H 'content-type: application/json'` +
    (state.token ? " -H 'authorization: Bearer $QUIVER_SERVER_AUTH_TOKEN'" : "") + ` -d '${body}'`;
  const answer = await api("/get-online-features", { method: "POST", body });
  const names = answer.metadata.feature_names, results = answer.results;
  const n = results.length ? results[0].values.length : 0;
  const head = el("tr", {}, names.map((name) => el("th", { class: "mono", text: name })));
  const rows = [];
  for (let i = 0; i < n; i++) {
    rows.push(el("tr", {}, results.map((r) => el("td", { class: "mono lookup-value", title: r.statuses[i], text: JSON.stringify(r.values[i]) }))));
  }
  $("lookup-answer").replaceChildren(el("div", { class: "card" }, el("h2", { text: "Answer" }), el("table", { id: "lookup-table" }, head, rows)));
  showError("");
}

// ---- pages -------------------------------------------------------------------------

const pages = {
  registry: async () => renderRegistry(),
  lineage: async () => renderLineage(),
  freshness: renderFreshness,
  statistics: renderStatistics,
  consistency: renderConsistency,
  monitoring: renderMonitoring,
  lookup: renderLookupForm,
};

async function show() {
  const page = (location.hash.slice(1).split("?")[0]) || "registry";
  for (const s of document.querySelectorAll("main section")) s.hidden = s.dataset.page !== page;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === `#${page}`);
  showError("");
  try {
    await (pages[page] || pages.registry)();
  } catch (e) {
    showError(e.message);
  }
  document.body.dataset.ready = page;
}

async function start() {
  try {
    state.registry = await api("/api/registry");
  } catch (e) {
    showError(e.message);
    return;
  }
  $("project").textContent = `${state.registry.project} · registry v${state.registry.version} · ${state.registry.store}`;
  $("search").oninput = renderRegistry;
  window.onhashchange = show;
  await show();
}

start();
