// sw.js — the app's service worker: keeps the app's own files so that it opens with no
// network, and shows notifications. It never stores data calls (events, feeds, tokens): those
// go to the network as they are, and what the app shows offline is in its IndexedDB.

const CACHE = "aa-app-2";
const SHELL = [
  "./",
  "app.js",
  "db.js",
  "net.js",
  "qr.js",
  "render.js",
  "app.css",
  "manifest.webmanifest",
  "icon-192.png",
  "icon-512.png",
  "/static/aa.js",
];
/** Milliseconds to wait for the router before the kept copy is used. */
const NETWORK_WAIT = 3000;

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(CACHE).then((c) => c.addAll(SHELL)).then(() => self.skipWaiting()));
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches
      .keys()
      .then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))
      .then(() => self.clients.claim()),
  );
});

function isShell(url) {
  if (url.origin !== self.location.origin) return false;
  return url.pathname.startsWith("/app/") || url.pathname === "/static/aa.js";
}

// The shell: the network first (a newer app wins), the kept copy when the router does not
// answer in time or at all. Navigations to /app/?pattern=… are the page "./". The kept copy is
// matched ignoring Vary: the files answer "Vary: Origin" (CORS), module scripts are asked for
// with an Origin header, and a file of the app is the same whoever asks.
self.addEventListener("fetch", (event) => {
  const req = event.request;
  const url = new URL(req.url);
  if (req.method !== "GET" || !isShell(url)) return;
  const key = req.mode === "navigate" ? "./" : req;
  event.respondWith(
    (async () => {
      const cache = await caches.open(CACHE);
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(), NETWORK_WAIT);
      try {
        const res = await fetch(req.mode === "navigate" ? url.pathname + url.search : req, { signal: abort.signal });
        if (res.ok) await cache.put(key, res.clone());
        return res;
      } catch {
        const kept = await cache.match(key, { ignoreSearch: true, ignoreVary: true });
        return kept || Response.error();
      } finally {
        clearTimeout(timer);
      }
    })(),
  );
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil(
    self.clients.matchAll({ type: "window" }).then((list) => (list.length ? list[0].focus() : self.clients.openWindow("./"))),
  );
});
