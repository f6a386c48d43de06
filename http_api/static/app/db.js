// db.js — the app's IndexedDB, which belongs to this router's origin (no other site reads it).
//
//   kv        settings: the user's token, the event counter
//   routers   { url, clientId, token, source, ok, error }: the HTTP client the app holds there
//   patterns  { id, source, notify }
//   events    { id, seq, event, router }: every event shown, once (its id is the key)
//   outbox    { id, body, created, error }: events published while no router answered
//
// The events store is the one that may be cut: past MAX_EVENTS, or when the quota is full,
// the oldest shown events go. The outbox is never cut: what the user published stays until a
// router has it.

const NAME = "aa-app";
const VERSION = 1;
/** Events kept for showing offline; the oldest beyond go. */
export const MAX_EVENTS = 2000;

let opened = null;

export function open() {
  if (opened) return opened;
  opened = new Promise((resolve, reject) => {
    const req = indexedDB.open(NAME, VERSION);
    req.onupgradeneeded = () => {
      const db = req.result;
      db.createObjectStore("kv", { keyPath: "k" });
      db.createObjectStore("routers", { keyPath: "url" });
      db.createObjectStore("patterns", { keyPath: "id" });
      db.createObjectStore("events", { keyPath: "id" }).createIndex("seq", "seq");
      db.createObjectStore("outbox", { keyPath: "id" }).createIndex("created", "created");
    };
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
  return opened;
}

function done(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onabort = () => reject(tx.error || new Error("transaction aborted"));
    tx.onerror = () => reject(tx.error);
  });
}

function result(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

export async function get(store, key) {
  const db = await open();
  return result(db.transaction(store).objectStore(store).get(key));
}

export async function put(store, value) {
  const db = await open();
  const tx = db.transaction(store, "readwrite");
  tx.objectStore(store).put(value);
  return done(tx);
}

export async function del(store, key) {
  const db = await open();
  const tx = db.transaction(store, "readwrite");
  tx.objectStore(store).delete(key);
  return done(tx);
}

export async function all(store, index = null) {
  const db = await open();
  const s = db.transaction(store).objectStore(store);
  return result(index ? s.index(index).getAll() : s.getAll());
}

export async function setting(k, fallback = null) {
  const row = await get("kv", k);
  return row ? row.v : fallback;
}

export function setSetting(k, v) {
  return put("kv", { k, v });
}

/**
 * Keep the events not kept yet (by id), numbered in the order they came; resolves to the
 * new ones only. One transaction: an event is either kept and counted, or not at all, so a
 * feed page is acknowledged only once its events are safe here.
 */
export async function keepEvents(items, router) {
  try {
    return await keepOnce(items, router);
  } catch (err) {
    if (!err || err.name !== "QuotaExceededError") throw err;
    await dropOldest(Math.max(50, Math.ceil((await count("events")) / 4)));
    return keepOnce(items, router);
  }
}

async function keepOnce(items, router) {
  const db = await open();
  const tx = db.transaction(["events", "kv"], "readwrite");
  const events = tx.objectStore("events");
  const kv = tx.objectStore("kv");
  const fresh = [];
  const seqRow = await result(kv.get("seq"));
  let seq = seqRow ? seqRow.v : 0;
  for (const item of items) {
    const known = await result(events.count(item.id));
    if (known) continue;
    seq += 1;
    const row = { id: item.id, seq, event: item.event, patterns: item.patterns || [], router };
    events.put(row);
    fresh.push(row);
  }
  kv.put({ k: "seq", v: seq });
  await done(tx);
  const n = await count("events");
  if (n > MAX_EVENTS) await dropOldest(n - MAX_EVENTS);
  return fresh;
}

export async function count(store) {
  const db = await open();
  return result(db.transaction(store).objectStore(store).count());
}

/** Drop the *n* oldest shown events (never anything of the outbox). */
export async function dropOldest(n) {
  const db = await open();
  const tx = db.transaction("events", "readwrite");
  const cursorReq = tx.objectStore("events").index("seq").openCursor();
  let left = n;
  cursorReq.onsuccess = () => {
    const c = cursorReq.result;
    if (!c || left <= 0) return;
    c.delete();
    left -= 1;
    c.continue();
  };
  return done(tx);
}
