// The web monitor: charts of this router's figures polled from GET /metrics (charts.js), the
// mesh drawn live from GET /mesh, events flowing past over GET /stream, and forms to publish,
// subscribe and try an HTTP client's feed. Built on aa.js.
// For tests and scripts, <body> carries data-routers, data-links, data-events and data-polls
// (answers of /metrics drawn) counts, and data-auth: "open" (no token needed), "asking" (the
// token form shows) or "token".
//
// A router that refuses anonymous callers answers 401: the page then asks for a user token
// (aa certs token), keeps it in sessionStorage (this origin's, this tab's, gone when the tab
// closes) and sends it as Authorization: Bearer; its stream opens with one-use tickets.

import { AaClient, AaHttpError } from "./aa.js";
import { CHARTS, History, POLL_MS, WINDOW_S, draw, parseMetrics } from "./charts.js";

const TOKEN_KEY = "aa.monitor.token";
const aa = new AaClient("", { userToken: sessionStorage.getItem(TOKEN_KEY) });
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const MESH_POLL_MS = 2000;
const MAX_ROWS = 200;

let selfId = null;
let seen = 0;
let subscription = null;

function el(name, attrs = {}, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function setStatus(text, ok) {
  $("status").textContent = text;
  $("status").className = ok ? "ok" : "";
}

// -- the mesh picture ---------------------------------------------------------------------

function layout(ids) {
  const cx = 300, cy = 205, r = ids.length > 1 ? 150 : 0;
  const pos = new Map();
  ids.forEach((id, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / ids.length;
    pos.set(id, [cx + r * Math.cos(a), cy + r * Math.sin(a)]);
  });
  return pos;
}

function drawMesh(info) {
  selfId = info.router || selfId;
  const routers = new Map();
  for (const r of info.routers || []) routers.set(r.id, r);
  for (const r of info.routers || []) {
    for (const p of r.peers || []) {  // a peer whose own summary has not come yet
      if (p.id && !routers.has(p.id)) routers.set(p.id, { id: p.id, name: p.name || p.id, peers: [] });
    }
  }
  const links = new Set((info.links || []).map(([a, b]) => `${a} ${b}`));
  const ids = [...routers.keys()].sort((a, b) => (a === selfId ? -1 : b === selfId ? 1 : a.localeCompare(b)));
  const pos = layout(ids);
  const svg = $("mesh");
  svg.replaceChildren();
  for (const link of links) {
    const [a, b] = link.split(" ");
    const [x1, y1] = pos.get(a), [x2, y2] = pos.get(b);
    svg.append(el("line", { class: "link", x1, y1, x2, y2 }));
  }
  for (const id of ids) {
    const r = routers.get(id);
    const [x, y] = pos.get(id);
    const g = el("g", { class: `router${id === selfId ? " self" : ""}`, "data-id": id, transform: `translate(${x},${y})` });
    g.append(el("circle", { r: 34 }));
    g.append(el("text", { y: 4 }, (r.name || id).slice(0, 18)));
    const c = r.counters || {};
    const sub = `${r.clients ?? "?"} clients · ${c.dispatched ?? c.events_in ?? 0} ev`;
    g.append(el("text", { class: "sub", y: 52 }, sub));
    g.append(el("title", {}, `${r.name || id}\n${id}\n${r.client || r.peer || ""}`));
    svg.append(g);
  }
  $("mesh-summary").textContent = `${ids.length} router${ids.length === 1 ? "" : "s"}, ${links.size} link${links.size === 1 ? "" : "s"}`;
  $("mesh-warning").textContent = differences(info.routers || []).join("; ");
  document.body.dataset.routers = String(ids.length);
  document.body.dataset.links = String(links.size);
}

// Routers enforcing different rules, as `aa mesh` says it: "permissions differ: r1, r2 vs r3".
function differences(routers) {
  const lines = [];
  for (const [key, what] of [["permissions", "permissions"], ["crl", "revocation lists"]]) {
    const groups = new Map();
    for (const r of routers) {
      if (!(key in r)) continue;
      const k = JSON.stringify(r[key]);
      if (!groups.has(k)) groups.set(k, []);
      groups.get(k).push(r.name || r.id);
    }
    if (groups.size < 2) continue;
    const sides = [...groups.values()].map((names) => names.sort()).sort((a, b) => b.length - a.length);
    lines.push(`${what} differ: ${sides.map((names) => names.join(", ")).join(" vs ")}`);
  }
  return lines;
}

function pulse(routerId) {
  const g = document.querySelector(`#mesh g.router[data-id="${CSS.escape(routerId || "")}"]`);
  if (!g) return;
  g.classList.add("pulse");
  setTimeout(() => g.classList.remove("pulse"), 300);
}

let meshTimer = null;

async function pollMesh() {
  clearTimeout(meshTimer);
  try {
    drawMesh(await aa.mesh());
    setStatus(`connected to ${selfId}`, true);
    if (document.body.dataset.auth !== "token") document.body.dataset.auth = aa.userToken ? "token" : "open";
    if (!subscription) subscribe($("pattern").value.trim() || "True"); // once the router lets us in
    if (chartsTimer === null) pollCharts();
  } catch (err) {
    if (err instanceof AaHttpError && err.status === 401) {
      askForToken(aa.userToken ? `token refused: ${err.message}` : "");
      return; // polled again once a token is given
    }
    setStatus(`mesh unavailable: ${err.message}`, false);
  }
  meshTimer = setTimeout(pollMesh, MESH_POLL_MS);
}

// -- the charts ---------------------------------------------------------------------------

const history = new History();
let chartsTimer = null;
let polls = 0;

async function pollCharts() {
  clearTimeout(chartsTimer);
  chartsTimer = setTimeout(pollCharts, POLL_MS);
  try {
    const text = await aa.metrics();
    const now = performance.now() / 1000;
    history.add(parseMetrics(text), now);
    const figures = $("charts");
    for (const chart of CHARTS) {
      let figure = figures.querySelector(`figure[data-chart="${chart.id}"]`);
      if (!figure) {
        figure = document.createElement("figure");
        figures.append(figure);
      }
      draw(figure, chart, history, now);
    }
    polls += 1;
    document.body.dataset.polls = String(polls);
  } catch (err) {
    if (err instanceof AaHttpError && err.status === 401) {
      askForToken(aa.userToken ? `token refused: ${err.message}` : "");
      return;
    }
    history.add([], performance.now() / 1000); // a gap in every line
    $("charts-summary").textContent = `figures unavailable: ${err.message}`;
  }
}

// -- the token ----------------------------------------------------------------------------

function askForToken(why) {
  clearTimeout(chartsTimer);
  chartsTimer = null;
  if (subscription) subscription.close();
  subscription = null;
  aa.userToken = null;
  sessionStorage.removeItem(TOKEN_KEY);
  setStatus("this router needs a token", false);
  $("token-result").textContent = why;
  $("token-result").className = why ? "error" : "";
  $("token-form").hidden = false;
  $("sign-out").hidden = true;
  document.body.dataset.auth = "asking";
  $("token").focus();
}

function useToken(token) {
  aa.userToken = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  $("token-form").hidden = true;
  $("sign-out").hidden = false;
  document.body.dataset.auth = "token";
  pollMesh();
}

$("token-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  const probe = new AaClient("", { userToken: token });
  try {
    await probe.mesh();
  } catch (err) {
    if (err instanceof AaHttpError && (err.status === 401 || err.status === 403)) {
      $("token-result").className = "error";
      $("token-result").textContent = err.message;
      return;
    }
  }
  useToken(token);
});

$("sign-out").addEventListener("click", () => askForToken(""));

// -- events flowing past ------------------------------------------------------------------

function show(list, event, tags) {
  const li = document.createElement("li");
  const t = document.createElement("span");
  t.className = "t";
  t.textContent = event.type || "event";
  li.append(t, document.createTextNode(describe(event.values)));
  if (tags) {
    const s = document.createElement("span");
    s.className = "tag";
    s.textContent = tags;
    li.append(s);
  }
  li.title = event.id;
  list.prepend(li);
  while (list.children.length > MAX_ROWS) list.lastChild.remove();
}

function describe(values) {
  return Object.entries(values)
    .map(([k, v]) => `${k}=${v instanceof Uint8Array ? `<${v.length} bytes>` : v instanceof Date ? v.aaIso : JSON.stringify(v)}`)
    .join(" ");
}

function subscribe(pattern) {
  if (subscription) subscription.close();
  // A new pattern starts a new list: the events shown and counted are the pattern's own.
  seen = 0;
  delete document.body.dataset.events;
  $("events").replaceChildren();
  subscription = aa.subscribe(pattern, (event) => {
    seen += 1;
    document.body.dataset.events = String(seen);
    $("events-summary").textContent = `${seen} seen · ${pattern}`;
    show($("events"), event);
    pulse(event.meta.router);
  }, {
    onError: (message, err) => {
      $("events-summary").textContent = `stopped: ${message}`;
      if (err instanceof AaHttpError && err.status === 401) askForToken(`token refused: ${message}`);
    },
  });
  $("events-summary").textContent = `${seen} seen · ${pattern}`;
}

// -- forms --------------------------------------------------------------------------------

$("subscribe-form").addEventListener("submit", (e) => {
  e.preventDefault();
  subscribe($("pattern").value.trim() || "True");
});

$("publish-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const out = $("publish-result");
  try {
    const values = JSON.parse($("values").value);
    const id = await aa.publish(values, { type: $("type").value.trim() || null });
    out.className = "";
    out.textContent = `published ${id}`;
  } catch (err) {
    out.className = "error";
    out.textContent = err.message;
  }
});

let cursor = null;

$("client-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const out = $("client-result");
  try {
    const me = await aa.registerClient({ name: "monitor", patterns: [$("client-pattern").value.trim()] });
    out.className = "";
    out.textContent = `client ${me.id} registered; its events are kept until it polls`;
    $("poll-btn").disabled = $("ack-btn").disabled = false;
  } catch (err) {
    out.className = "error";
    out.textContent = err.message;
  }
});

$("poll-btn").addEventListener("click", async () => {
  const page = await aa.feed();
  cursor = page.cursor;
  $("feed").replaceChildren();
  for (const { event, patterns } of page.entries) show($("feed"), event, patterns.join(","));
  $("client-result").textContent = `${page.entries.length} queued, cursor ${cursor}${page.more ? ", more" : ""}`;
});

$("ack-btn").addEventListener("click", async () => {
  if (cursor === null) return;
  await aa.ack(cursor);
  $("feed").replaceChildren();
  $("client-result").textContent = `acknowledged up to ${cursor}`;
});

if (aa.userToken) $("sign-out").hidden = false;
pollMesh();
