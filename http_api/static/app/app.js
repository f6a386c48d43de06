// app.js — the Aa phone app: subscribe by content, see events once each, publish even while
// offline, and roam between the routers of a mesh.
//
// How events reach the screen exactly once: the app holds an HTTP client (POST /clients) at
// each router it uses, with the same patterns, so the mesh keeps every matching event for it
// while the phone is away. Each poll of a router's feed keeps the new events in IndexedDB
// (keyed by event id, so an event that came through two routers, or twice through one, is
// kept once) and only then acknowledges the page's cursor: an event is dropped from the mesh
// only once it is safe here. When the app's router is unreachable, the next router's client
// has been keeping the same events all along, and the same rule shows each once.
//
// Publishing: every event goes to the outbox first with an id the app chooses, then to a
// router; the outbox entry is deleted when a router answers 201 (published) or 200 (a
// duplicate: the mesh had it already). A retry, through any router, is therefore never a
// second event: the mesh de-duplicates ids of one publisher, and the app sends the same
// credentials everywhere (the user's token, or none).

import * as db from "./db.js";
import { call, Refused, Unreachable } from "./net.js";
import { qrSvg } from "./qr.js";
import { eventDetail, eventRow, readable } from "./render.js";

/** Milliseconds between polls of the router in use, and of the others (their keep-alive). */
const POLL = 1500;
const POLL_OTHERS = 10000;
/** Routers the app keeps a client at: its own and a few more, each a cost to the mesh. */
const MAX_ROUTERS = 4;
/** Events drawn in the list (the newest); the rest stay kept for when they are newest. */
const SHOWN = 200;
/** Feed pages read per poll: a long absence is caught up over a few polls. */
const PAGES_PER_POLL = 10;

const $ = (id) => document.getElementById(id);
const own = location.origin;
const state = { current: own, busy: false, lastOthers: 0, patternsVersion: 0, online: true };

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function toast(text) {
  const t = $("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 4000);
}

// -- routers ------------------------------------------------------------------------------

async function routers() {
  const rows = await db.all("routers");
  // Its own router first, then those the user added, then those guessed from the mesh.
  const rank = (r) => (r.url === own ? 0 : r.source === "mesh" ? 2 : 1);
  rows.sort((a, b) => rank(a) - rank(b) || (a.added || 0) - (b.added || 0));
  return rows;
}

function normaliseUrl(text) {
  const u = new URL(text.trim());
  if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error("a router's address starts with http:// or https://");
  return u.origin;
}

async function addRouter(url, source) {
  const origin = normaliseUrl(url);
  const known = await db.get("routers", origin);
  if (!known) {
    if ((await db.count("routers")) >= MAX_ROUTERS * 4) throw new Error("too many routers known: remove one first");
    await db.put("routers", { url: origin, source, added: Date.now(), clientId: null, token: null, pids: {}, version: -1 });
  }
  return origin;
}

/** Routers the mesh knows, at their HTTP port by the convention (TCP port + 1). */
async function learnMesh(base) {
  const info = await call(base, "GET", "/mesh", { token: await db.setting("token") });
  for (const r of (info.routers || []).slice(0, 16)) {
    const endpoint = typeof r.client === "string" ? r.client : null;
    const m = endpoint && endpoint.match(/^(\[[^\]]+\]|[^:]+):(\d+)$/);
    if (!m) continue;
    const url = `${location.protocol}//${m[1]}:${Number(m[2]) + 1}`;
    if (!(await db.get("routers", url))) await addRouter(url, "mesh").catch(() => {});
  }
}

// -- the client at each router -------------------------------------------------------------

async function userToken() {
  return db.setting("token");
}

/** The token for calls about the app's client at router *r*: the client's own. */
function clientCall(r, method, path, body) {
  return call(r.url, method, `/clients/${encodeURIComponent(r.clientId)}${path}`, { body, token: r.token });
}

async function ensureClient(r) {
  if (r.clientId) return r;
  const patterns = await db.all("patterns");
  const body = JSON.stringify({
    name: "aa app",
    keepalive: "7d",
    policy: { max_count: 1000 },
    patterns: patterns.map((p) => ({ source: p.source })),
  });
  const res = await call(r.url, "POST", "/clients", { body, token: await userToken() });
  r.clientId = String(res.id);
  r.token = String(res.token);
  r.pids = {};
  r.version = -1;
  await db.put("routers", r);
  return r;
}

/** Make the client's patterns at *r* the app's, and remember which remote id is which. */
async function reconcile(r) {
  const version = await db.setting("patternsVersion", 0);
  if (r.version === version) return;
  const local = await db.all("patterns");
  const remote = await clientCall(r, "GET", "/patterns");
  const bySource = new Map(remote.map((p) => [p.source, p.id]));
  const pids = {};
  for (const p of local) {
    let pid = bySource.get(p.source);
    if (pid === undefined) {
      try {
        pid = (await clientCall(r, "POST", "/patterns", JSON.stringify({ source: p.source }))).id;
      } catch (err) {
        if (!(err instanceof Refused)) throw err;
        p.error = err.message;
        await db.put("patterns", p);
        continue;
      }
    }
    pids[pid] = p.id;
  }
  for (const p of remote) if (!(p.id in pids)) await clientCall(r, "DELETE", `/patterns/${encodeURIComponent(p.id)}`).catch(() => {});
  r.pids = pids;
  r.version = version;
  await db.put("routers", r);
}

/** Read the client's feed at *r*, keep the new events, then acknowledge. */
async function poll(r) {
  try {
    await ensureClient(r);
    await reconcile(r);
    let fresh = [];
    for (let page = 0; page < PAGES_PER_POLL; page++) {
      const res = await clientCall(r, "GET", "/feed?format=json&limit=100");
      const entries = Array.isArray(res.entries) ? res.entries : [];
      const items = entries
        .filter((e) => e && e.event && typeof e.event.id === "string")
        .map((e) => ({ id: e.event.id, event: e.event, patterns: (e.patterns || []).map((pid) => r.pids[pid]).filter(Boolean) }));
      fresh = fresh.concat(await db.keepEvents(items, r.url));
      if (typeof res.cursor === "number") await clientCall(r, "POST", "/ack", JSON.stringify({ cursor: res.cursor }));
      if (!res.more) break;
    }
    r.ok = Date.now();
    r.error = null;
    await db.put("routers", r);
    return fresh;
  } catch (err) {
    if (err instanceof Refused && (err.status === 401 || err.status === 404) && r.clientId) {
      // The client is gone there (expired, or the router restarted): register it again.
      r.clientId = r.token = null;
      r.version = -1;
    }
    r.error = err.message;
    await db.put("routers", r);
    throw err;
  }
}

// -- the loop ------------------------------------------------------------------------------

async function tick() {
  if (state.busy) return;
  state.busy = true;
  try {
    await flushOutbox();
    const list = await routers();
    const order = [list.find((r) => r.url === state.current), ...list.filter((r) => r.url !== state.current)].filter(Boolean);
    let fresh = null;
    let lastError = null;
    for (const r of order.slice(0, MAX_ROUTERS)) {
      try {
        fresh = await poll(r);
        if (state.current !== r.url) toast(`Now through ${r.url}`);
        state.current = r.url;
        break;
      } catch (err) {
        lastError = err;
        if (err instanceof Refused && err.status === 401) {
          needToken(err.message);
          break;
        }
      }
    }
    setOnline(fresh !== null, lastError);
    if (fresh && fresh.length) {
      notify(fresh);
      await drawEvents();
    }
    if (fresh !== null && Date.now() - state.lastOthers > POLL_OTHERS) {
      state.lastOthers = Date.now();
      learnMesh(state.current).catch(() => {});
      for (const r of order.slice(0, MAX_ROUTERS)) {
        if (r.url === state.current) continue;
        const more = await poll(r).catch(() => null); // their keep-alive, and a second source
        if (more && more.length) {
          notify(more);
          await drawEvents();
        }
      }
    }
    await drawRouters();
  } finally {
    state.busy = false;
  }
}

function setOnline(online, err) {
  state.online = online;
  document.body.dataset.online = String(online);
  document.body.dataset.router = state.current;
  $("status").textContent = online ? `online · ${new URL(state.current).host}` : `offline${err ? ` · ${err.message}` : ""}`;
  $("status").className = online ? "on" : "off";
}

function needToken(message) {
  $("token-note").textContent = `This mesh asks who you are: ${message}`;
  show("routers");
}

// -- events --------------------------------------------------------------------------------

async function drawEvents() {
  const rows = await db.all("events");
  const time = (row) => {
    const t = readable(row.event).time;
    return t ? t.getTime() : 0;
  };
  rows.sort((a, b) => time(b) - time(a) || b.seq - a.seq);
  const list = $("events");
  list.replaceChildren(...rows.slice(0, SHOWN).map((row) => {
    const li = eventRow(row);
    li.addEventListener("click", () => openDetail(row));
    return li;
  }));
  $("events-empty").hidden = rows.length > 0;
  document.body.dataset.events = String(rows.length);
}

function openDetail(row) {
  $("detail-body").replaceChildren(eventDetail(row));
  $("detail").showModal();
}

async function notify(rows) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  const patterns = new Map((await db.all("patterns")).map((p) => [p.id, p]));
  const reg = await navigator.serviceWorker?.getRegistration();
  for (const row of rows.slice(0, 5)) {
    if (!row.patterns.some((id) => patterns.get(id)?.notify)) continue;
    const e = readable(row.event);
    const body = Object.entries(e.values).slice(0, 3).map(([k, v]) => `${k}: ${String(v).slice(0, 40)}`).join(", ");
    const title = e.type || "Aa event";
    if (reg) reg.showNotification(title.slice(0, 60), { body, tag: e.id.slice(0, 100) });
  }
}

// -- patterns ------------------------------------------------------------------------------

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The expression the form stands for; throws with a sentence for a mistake. */
function formExpression() {
  const typed = $("pattern-expr").value.trim();
  if (typed) return typed;
  const parts = [];
  const type = $("pattern-type").value.trim();
  if (type) parts.push(`type == ${JSON.stringify(type)}`);
  for (const row of document.querySelectorAll(".condition")) {
    const name = row.querySelector(".c-name").value.trim();
    const op = row.querySelector(".c-op").value;
    const raw = row.querySelector(".c-value").value.trim();
    if (!name && !raw) continue;
    if (!NAME.test(name)) throw new Error(`a value's name is letters, digits and _ (not ${JSON.stringify(name)})`);
    const value = /^-?\d+(\.\d+)?$/.test(raw) ? raw : JSON.stringify(raw);
    parts.push(op === "contains" ? `${JSON.stringify(raw)} in ${name}` : `${name} ${op} ${value}`);
  }
  if (!parts.length) throw new Error("give a type, a condition or an expression");
  return parts.join(" and ");
}

async function bumpPatterns() {
  await db.setSetting("patternsVersion", (await db.setting("patternsVersion", 0)) + 1);
}

/**
 * Subscribe to *source*: the router in use checks it first (its error goes back to the form);
 * without any router it is kept, and checked when one answers.
 */
async function subscribe(source, notifyToo = false) {
  const known = (await db.all("patterns")).find((p) => p.source === source);
  if (known) return known;
  const r = (await db.get("routers", state.current)) || (await db.get("routers", own));
  let checked = false;
  try {
    await ensureClient(r);
    await reconcile(r);
    await clientCall(r, "POST", "/patterns", JSON.stringify({ source }));
    checked = true;
  } catch (err) {
    if (err instanceof Refused) throw err;
  }
  const p = { id: crypto.randomUUID(), source, notify: notifyToo, checked, error: null, added: Date.now() };
  await db.put("patterns", p);
  await bumpPatterns();
  await drawPatterns();
  state.busy || tick();
  return p;
}

async function unsubscribe(p) {
  await db.del("patterns", p.id);
  await bumpPatterns();
  await drawPatterns();
  tick();
}

function shareLink(source) {
  return `${own}/app/?pattern=${encodeURIComponent(source)}`;
}

async function drawPatterns() {
  const list = $("patterns");
  const items = (await db.all("patterns")).sort((a, b) => (a.added || 0) - (b.added || 0));
  list.replaceChildren(...items.map((p) => {
    const li = el("li", "pattern");
    li.append(el("code", null, p.source.slice(0, 500)));
    if (p.error) li.append(el("p", "error", p.error));
    const tools = el("div", "tools");
    const label = el("label");
    const box = el("input");
    box.type = "checkbox";
    box.checked = !!p.notify;
    box.addEventListener("change", async () => {
      if (box.checked && "Notification" in window && Notification.permission === "default") await Notification.requestPermission();
      p.notify = box.checked && "Notification" in window && Notification.permission === "granted";
      box.checked = p.notify;
      await db.put("patterns", p);
      if (box.checked !== p.notify || (!p.notify && Notification.permission === "denied")) toast("Notifications are blocked for this site");
    });
    label.append(box, " notify");
    const share = el("button", "share", "Share");
    share.type = "button";
    share.addEventListener("click", () => openShare(p.source));
    const remove = el("button", "remove", "Remove");
    remove.type = "button";
    remove.addEventListener("click", () => unsubscribe(p));
    tools.append(label, share, remove);
    li.append(tools);
    return li;
  }));
}

function openShare(source) {
  const link = shareLink(source);
  const box = $("share-body");
  box.replaceChildren();
  try {
    box.append(qrSvg(link));
  } catch (err) {
    box.append(el("p", "error", err.message));
  }
  const a = el("a", "link", link);
  a.href = link;
  box.append(a);
  $("share").showModal();
}

// -- publishing ----------------------------------------------------------------------------

function randomId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return `app-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

async function publish(type, valuesText) {
  let values;
  try {
    values = JSON.parse(valuesText);
  } catch (err) {
    throw new Error(`the values are not JSON: ${err.message}`);
  }
  if (values === null || typeof values !== "object" || Array.isArray(values)) throw new Error('the values are a JSON object: {"name": value, …}');
  const id = randomId();
  const body = `{"values":${valuesText.trim()},${type ? `"type":${JSON.stringify(type)},` : ""}"id":${JSON.stringify(id)}}`;
  await db.put("outbox", { id, body, created: Date.now(), error: null });
  await drawOutbox();
  await flushOutbox();
  return id;
}

let flushing = null;

function flushOutbox() {
  flushing = flushing || sendOutbox().finally(() => (flushing = null));
  return flushing;
}

async function sendOutbox() {
  const items = (await db.all("outbox", "created")).filter((o) => !o.error);
  if (!items.length) return;
  const list = await routers();
  const order = [list.find((r) => r.url === state.current), ...list.filter((r) => r.url !== state.current)].filter(Boolean);
  const token = await userToken();
  for (const item of items) {
    let sent = false;
    for (const r of order) {
      try {
        await call(r.url, "POST", "/events", { body: item.body, token });
        sent = true;
        break;
      } catch (err) {
        if (err instanceof Refused && err.status !== 429 && err.status !== 503) {
          item.error = err.message; // refused for good: kept, shown, for the user to drop
          await db.put("outbox", item);
          sent = null;
          break;
        }
      }
    }
    if (sent === false) break; // no router answered: keep the rest, in order, for later
    if (sent) await db.del("outbox", item.id);
  }
  await drawOutbox();
}

async function drawOutbox() {
  const items = await db.all("outbox", "created");
  document.body.dataset.outbox = String(items.length);
  $("outbox-summary").textContent = items.length ? `${items.length} waiting to be sent` : "nothing waiting";
  $("outbox").replaceChildren(...items.map((o) => {
    const li = el("li", o.error ? "failed" : "waiting", o.body.slice(0, 200));
    if (o.error) {
      li.append(el("p", "error", o.error));
      const drop = el("button", null, "Drop");
      drop.type = "button";
      drop.addEventListener("click", async () => {
        await db.del("outbox", o.id);
        await drawOutbox();
      });
      li.append(drop);
    }
    return li;
  }));
}

// -- routers view --------------------------------------------------------------------------

async function drawRouters() {
  const list = await routers();
  $("routers").replaceChildren(...list.map((r) => {
    const li = el("li", r.url === state.current ? "current" : "");
    li.append(el("span", "url", r.url));
    li.append(el("span", "source", r.source));
    li.append(el("span", r.error ? "error" : "ok", r.error ? r.error.slice(0, 200) : r.ok ? `answered ${new Date(r.ok).toLocaleTimeString()}` : "not tried yet"));
    return li;
  }));
}

// -- views and forms -----------------------------------------------------------------------

function show(view) {
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== `${view}-view`;
  for (const b of document.querySelectorAll("nav button")) b.setAttribute("aria-current", String(b.dataset.view === view));
}

function wire() {
  for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => show(b.dataset.view));
  $("pattern-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = $("pattern-error");
    out.textContent = "";
    try {
      await subscribe(formExpression(), $("pattern-notify").checked);
      $("pattern-form").reset();
      toast("Subscribed");
    } catch (err) {
      out.textContent = err.message;
    }
  });
  $("add-condition").addEventListener("click", () => {
    const rows = document.querySelectorAll(".condition");
    if (rows.length < 6) rows[0].parentNode.insertBefore(rows[0].cloneNode(true), $("add-condition")).querySelectorAll("input").forEach((i) => (i.value = ""));
  });
  $("publish-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = $("publish-result");
    try {
      const id = await publish($("publish-type").value.trim(), $("publish-values").value);
      out.textContent = `queued ${id}`;
      out.className = "";
    } catch (err) {
      out.textContent = err.message;
      out.className = "error";
    }
  });
  $("router-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await addRouter($("router-url").value, "added");
      $("router-url").value = "";
      await drawRouters();
      tick();
    } catch (err) {
      toast(err.message);
    }
  });
  $("token-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const token = $("token").value.trim();
    await db.setSetting("token", token || null);
    $("token").value = "";
    $("token-note").textContent = token ? "Token kept on this device, for this router's app only." : "No token: anonymous.";
    tick();
  });
  for (const d of document.querySelectorAll("dialog")) d.querySelector(".close").addEventListener("click", () => d.close());
  window.addEventListener("online", () => tick());
}

async function start() {
  wire();
  show("events");
  await addRouter(own, "this router");
  const params = new URLSearchParams(location.search);
  for (const url of params.getAll("router").slice(0, MAX_ROUTERS)) await addRouter(url, "added").catch((err) => toast(err.message));
  await Promise.all([drawEvents(), drawPatterns(), drawOutbox(), drawRouters()]);
  setOnline(navigator.onLine, null);
  const shared = params.get("pattern");
  if (shared) {
    history.replaceState(null, "", `${location.pathname}`);
    try {
      await subscribe(shared.slice(0, 4000));
      toast(`Subscribed to ${shared.slice(0, 80)}`);
    } catch (err) {
      show("subscribe");
      $("pattern-expr").value = shared.slice(0, 4000);
      $("pattern-error").textContent = err.message;
    }
  }
  if ("serviceWorker" in navigator) navigator.serviceWorker.register("sw.js", { scope: "./" }).catch(() => {});
  document.body.dataset.ready = "true";
  tick();
  setInterval(tick, POLL);
}

start();
