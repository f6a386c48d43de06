// The monitor's charts: the router's own figures (GET /metrics, Prometheus's text format),
// polled every few seconds and drawn as plain SVG over the last few minutes. Counters are
// drawn as rates (the difference between two polls over the time between them), gauges as
// they are, and the dispatch time as the p50 and p99 of the histogram's samples between two
// polls. Nothing is kept but the points of the window.
//
// For tests and scripts each line carries data-series, data-last (its last value), data-peak
// (its highest) and data-area (the sum of value × seconds over the window: for a rate, the
// events it counts).

const SVG = "http://www.w3.org/2000/svg";
export const POLL_MS = 2000;
export const WINDOW_S = 300;
const W = 420, H = 150, LEFT = 44, RIGHT = 8, TOP = 8, BOTTOM = 22;
const COLOURS = ["#2f6fdf", "#e07b24", "#15803d", "#b91c1c", "#7c3aed", "#0e7490"];

/** Prometheus text format → [{name, labels: {…}, value}]. Comments and bad lines are skipped. */
export function parseMetrics(text) {
  const out = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const raw of text.split("\n")) {
    if (!raw || raw[0] === "#") continue;
    const m = line.exec(raw);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] || "").matchAll(label)) labels[k] = v.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function total(samples, name, where = () => true) {
  let sum = 0, found = false;
  for (const s of samples) {
    if (s.name === name && where(s.labels)) {
      sum += s.value;
      found = true;
    }
  }
  return found ? sum : null;
}

/** The q-quantile (0..1) of the histogram samples between two polls, from cumulative buckets
 * [[le, count]…]; linear inside a bucket. null when no sample came in between. */
export function quantile(before, after, q) {
  if (!before || !after || before.length !== after.length) return null;
  const deltas = after.map(([le, n], i) => [le, n - before[i][1]]);
  const count = deltas[deltas.length - 1][1];
  if (!(count > 0)) return null;
  const want = q * count;
  let lower = 0, below = 0;
  for (const [le, n] of deltas) {
    if (n >= want) {
      if (!Number.isFinite(le)) return lower;
      return lower + (le - lower) * ((want - below) / Math.max(n - below, 1e-9));
    }
    lower = le;
    below = n;
  }
  return lower;
}

function buckets(samples, name) {
  const b = samples
    .filter((s) => s.name === `${name}_bucket`)
    .map((s) => [s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), s.value]);
  return b.length ? b.sort((x, y) => x[0] - y[0]) : null;
}

// -- what each chart shows ---------------------------------------------------------------

const DROP_REASONS = ["slow_subscriber", "slow_peer", "too_large", "refused", "worker_busy", "event_log"];

/** Each chart: its id, title, unit, and series: [label, kind ("rate" | "gauge"), read(samples)]. */
export const CHARTS = [
  {
    id: "events", title: "Events per second", unit: "/s", series: [
      ["published", "rate", (s) => total(s, "aa_events_published_total")],
      ["from peers", "rate", (s) => total(s, "aa_events_from_peers_total")],
      ["delivered", "rate", (s) => total(s, "aa_events_delivered_total")],
      ["forwarded", "rate", (s) => total(s, "aa_events_forwarded_total")],
    ],
  },
  {
    id: "drops", title: "Dropped per second, by reason", unit: "/s", series: [
      ...DROP_REASONS.map((reason) => [reason.replace("_", " "), "rate", (s) => total(s, "aa_events_dropped_total", (l) => l.reason === reason)]),
    ],
  },
  {
    id: "connections", title: "Clients and peer links", unit: "", series: [
      ["TCP clients", "gauge", (s) => total(s, "aa_clients")],
      ["HTTP clients", "gauge", (s) => total(s, "aa_http_clients")],
      ["peer links", "gauge", (s) => total(s, "aa_peer_links")],
    ],
  },
  {
    id: "latency", title: "Dispatch time (ms)", unit: " ms", series: [
      ["p50", "quantile:0.5", (s) => buckets(s, "aa_dispatch_seconds")],
      ["p99", "quantile:0.99", (s) => buckets(s, "aa_dispatch_seconds")],
    ],
  },
  {
    id: "backlog", title: "Backlog (events waiting)", unit: "", series: [
      ["store", "gauge", (s) => total(s, "aa_store_events_pending")],
      ["event log", "gauge", (s) => total(s, "aa_event_log_rows_waiting")],
    ],
  },
];

/** The points of every series, kept over `WINDOW_S`; `add(samples, t)` with t in seconds. */
export class History {
  constructor() {
    this.prev = null; // {t, raw: Map(key → raw value)}
    this.points = new Map(); // "chart/label" → [[t, v|null]…]
  }

  add(samples, t) {
    const raw = new Map();
    for (const chart of CHARTS) {
      for (const [label, kind, read] of chart.series) {
        const key = `${chart.id}/${label}`;
        const now = read(samples);
        raw.set(key, now);
        if (this.prev === null) continue;
        const was = this.prev.raw.get(key);
        const dt = t - this.prev.t;
        let v = null;
        if (now === null || dt <= 0) v = null;
        else if (kind === "gauge") v = now;
        else if (kind === "rate") v = was === null || was === undefined ? null : Math.max(0, now - was) / dt;
        else if (kind.startsWith("quantile:")) {
          const q = quantile(was, now, Number(kind.slice(9)));
          v = q === null ? null : q * 1000;
        }
        if (!this.points.has(key)) this.points.set(key, []);
        const pts = this.points.get(key);
        pts.push([t, v]);
        while (pts.length && pts[0][0] < t - WINDOW_S) pts.shift();
      }
    }
    this.prev = { t, raw };
  }
}

// -- drawing ------------------------------------------------------------------------------

function el(name, attrs = {}, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function nice(max) {
  if (!(max > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= max) return m * step;
  return 10 * step;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (Math.abs(v) >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) || Math.abs(v) >= 10 ? `${Math.round(v)}` : v.toFixed(v >= 1 ? 1 : 2);
}

/** Draw *chart* (one of `CHARTS`) from *history* into *figure* (a <figure>), as of time *now*. */
export function draw(figure, chart, history, now) {
  const series = chart.series.map(([label], i) => {
    const pts = history.points.get(`${chart.id}/${label}`) || [];
    const values = pts.map(([, v]) => v).filter((v) => v !== null);
    let area = 0;
    for (let j = 1; j < pts.length; j++) if (pts[j][1] !== null) area += pts[j][1] * (pts[j][0] - pts[j - 1][0]);
    return { label, pts, colour: COLOURS[i % COLOURS.length], last: values.length ? values[values.length - 1] : null, peak: values.length ? Math.max(...values) : null, area };
  });
  const top = nice(Math.max(0, ...series.map((s) => s.peak ?? 0)));
  const x = (t) => LEFT + ((t - (now - WINDOW_S)) / WINDOW_S) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / top) * (H - TOP - BOTTOM);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": chart.title });
  for (const f of [0, 0.5, 1]) {
    svg.append(el("line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(top * f), y2: y(top * f) }));
    svg.append(el("text", { class: "tick", x: LEFT - 4, y: y(top * f) + 4, "text-anchor": "end" }, fmt(top * f)));
  }
  for (const [t, label] of [[now - WINDOW_S, `-${WINDOW_S / 60} min`], [now, "now"]]) {
    svg.append(el("text", { class: "tick", x: x(t), y: H - 6, "text-anchor": t === now ? "end" : "start" }, label));
  }
  for (const s of series) {
    // a gap where a value is missing (no samples, or the router did not answer)
    let d = "", pen = false;
    for (const [t, v] of s.pts) {
      if (v === null) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    }
    svg.append(el("path", {
      class: "series", d, stroke: s.colour, "data-series": s.label,
      "data-last": s.last ?? "", "data-peak": s.peak ?? "", "data-area": s.area,
    }));
  }
  const legend = document.createElement("figcaption");
  const title = document.createElement("strong");
  title.textContent = chart.title;
  legend.append(title);
  for (const s of series) {
    const item = document.createElement("span");
    item.className = "key";
    item.style.setProperty("--c", s.colour);
    item.textContent = `${s.label} ${fmt(s.last)}${s.last === null ? "" : chart.unit}`;
    legend.append(item);
  }
  figure.replaceChildren(legend, svg);
  figure.dataset.chart = chart.id;
}
