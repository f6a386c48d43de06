// aa.js — a small client of an Aa router's HTTP endpoint, as an ES module with no
// dependencies. Any web page can import it on its own:
//
//   import { AaClient } from "http://<router>:7448/static/aa.js";
//   const aa = new AaClient("http://<router>:7448");
//   await aa.publish({ Temperature: 101, Sensor: "lab-1" }, { type: "reading" });
//   const sub = aa.subscribe("Temperature > 100", (event) => console.log(event.values));
//   const me = await aa.registerClient({ patterns: ["Temperature > 100"] });
//   const page = await aa.feed();              // { cursor, more, entries: [{ patterns, event }] }
//   await aa.ack(page.cursor);
//
// On a router that refuses anonymous callers, give a user token (`aa certs token`):
// `new AaClient(base, { userToken })`. It goes as `Authorization: Bearer` on every call, and
// a stream (EventSource sends no headers) opens with a one-use ticket asked for with it.
//
// Values travel as the typed JSON of aa.mesh.jsonvalues: bytes are {"$bytes": base64},
// datetimes {"$datetime": ISO 8601}. Decoded here to Uint8Array and Date (a Date keeps
// milliseconds; the ISO text is kept as `date.aaIso`). JavaScript has one number type, so a
// whole number is sent as an int: wrap a value in `new AaFloat(x)` to send a float.

/** Milliseconds before a broken stream is opened again with a new ticket. */
const STREAM_RETRY_MS = 2000;

/** A number to be sent as a float even when it is whole (1.0 rather than 1). */
export class AaFloat {
  constructor(value) {
    this.value = Number(value);
  }
}

/** An HTTP error answered by the router: `status`, `code` and `message`. */
export class AaHttpError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

function b64encode(bytes) {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

function b64decode(text) {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/** JSON text of a value in the typed form (see the module comment). */
export function toTypedJSON(value) {
  if (value === null || value === undefined) return "null";
  if (value instanceof AaFloat) {
    const v = value.value;
    if (!Number.isFinite(v)) throw new TypeError("JSON cannot carry NaN or infinities");
    return Number.isInteger(v) ? `${v}.0` : JSON.stringify(v);
  }
  if (value instanceof Date) return JSON.stringify({ $datetime: value.aaIso || value.toISOString() });
  if (value instanceof Uint8Array || value instanceof ArrayBuffer) {
    return JSON.stringify({ $bytes: b64encode(new Uint8Array(value)) });
  }
  if (Array.isArray(value)) return `[${value.map(toTypedJSON).join(",")}]`;
  if (typeof value === "object") {
    const keys = Object.keys(value);
    const body = keys.map((k) => `${JSON.stringify(k)}:${toTypedJSON(value[k])}`).join(",");
    return keys.length === 1 && keys[0].startsWith("$") ? `{"$map":{${body}}}` : `{${body}}`;
  }
  return JSON.stringify(value);
}

/** The values a typed-JSON object stands for. */
export function fromTyped(value) {
  if (Array.isArray(value)) return value.map(fromTyped);
  if (value === null || typeof value !== "object") return value;
  const keys = Object.keys(value);
  if (keys.length === 1) {
    const [k] = keys;
    if (k === "$bytes") return b64decode(value[k]);
    if (k === "$datetime") {
      const d = new Date(value[k]);
      d.aaIso = value[k];
      return d;
    }
    if (k === "$map") return Object.fromEntries(Object.entries(value[k]).map(([n, v]) => [n, fromTyped(v)]));
  }
  return Object.fromEntries(keys.map((n) => [n, fromTyped(value[n])]));
}

/** An event from its typed JSON: { id, type, values, meta }. */
export function eventFromJSON(data) {
  return { id: data.id, type: data.type, values: fromTyped(data.values || {}), meta: fromTyped(data.meta || {}) };
}

function patternBody(pattern) {
  return typeof pattern === "string" ? { source: pattern } : pattern;
}

/** A client of one router's HTTP endpoint. */
export class AaClient {
  /**
   * @param {string} base  the endpoint's URL ("" for the page's own origin)
   * @param {{clientId?: string, token?: string, userToken?: string}} options  an HTTP client
   *   registered before; a user token from `aa certs token` for every call
   */
  constructor(base = "", { clientId = null, token = null, userToken = null } = {}) {
    this.base = base.replace(/\/$/, "");
    this.clientId = clientId;
    this.token = token;
    this.userToken = userToken;
  }

  async request(method, path, { body, headers = {}, auth = false } = {}) {
    const h = { Accept: "application/json", ...headers };
    if (body !== undefined) h["Content-Type"] = "application/json";
    if (auth) {
      if (!this.token) throw new Error("register a client first (registerClient)");
      h.Authorization = `Bearer ${this.token}`;
    } else if (this.userToken) {
      h.Authorization = `Bearer ${this.userToken}`;
    }
    const res = await fetch(this.base + path, { method, headers: h, body, referrerPolicy: "no-referrer" });
    if (res.status === 204 || res.status === 304) return null;
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw new AaHttpError(res.status, data.error || "error", data.message || res.statusText);
    return data;
  }

  /** The mesh as the router knows it: { routers: [{ id, name, peers, counters, … }] }. */
  mesh() {
    return this.request("GET", "/mesh");
  }

  health() {
    return this.request("GET", "/health");
  }

  /** The router's counters, GET /metrics: Prometheus's text format, as a string. */
  async metrics() {
    const h = this.userToken ? { Authorization: `Bearer ${this.userToken}` } : {};
    const res = await fetch(`${this.base}/metrics`, { headers: h, referrerPolicy: "no-referrer" });
    if (!res.ok) {
      const data = await res.json().catch(() => ({}));
      throw new AaHttpError(res.status, data.error || "error", data.message || res.statusText);
    }
    return res.text();
  }

  /** Publish; resolves to the event's id. */
  async publish(values, { type = null, meta = undefined, id = undefined } = {}) {
    const parts = [`"values":${toTypedJSON(values)}`];
    if (type !== null && type !== undefined) parts.push(`"type":${JSON.stringify(type)}`);
    if (meta !== undefined) parts.push(`"meta":${toTypedJSON(meta)}`);
    if (id !== undefined) parts.push(`"id":${JSON.stringify(id)}`);
    const res = await this.request("POST", "/events", { body: `{${parts.join(",")}}` });
    return res.id;
  }

  /** Stored and cached events matching a pattern. */
  async history(pattern = "True", { since, limit } = {}) {
    const q = new URLSearchParams({ pattern });
    if (since !== undefined) q.set("since", since);
    if (limit !== undefined) q.set("limit", String(limit));
    const res = await this.request("GET", `/events?${q}`);
    return res.events.map(eventFromJSON);
  }

  /**
   * Live events matching a pattern, over server-sent events. Returns { close() }.
   * onError(message) is called when the router stops the pattern or the stream breaks.
   * With a user token, each (re)connection opens with a fresh one-use ticket
   * (POST /stream/tickets): a refused ticket request (a revoked token) is an onError.
   */
  subscribe(pattern, onEvent, { kernel = "python", format = "expr", onError, onDropped } = {}) {
    const handle = { source: null, closed: false, close() { this.closed = true; if (this.source) this.source.close(); } };
    const open = async () => {
      const q = new URLSearchParams({ pattern, kernel, format });
      if (this.userToken) {
        try {
          q.set("ticket", (await this.request("POST", "/stream/tickets")).ticket);
        } catch (err) {
          if (err instanceof AaHttpError && err.status < 500) {
            handle.closed = true;
            if (onError) onError(err.message, err);
          } else if (!handle.closed) {
            setTimeout(open, STREAM_RETRY_MS);
          }
          return;
        }
      }
      if (handle.closed) return;
      const source = (handle.source = new EventSource(`${this.base}/stream?${q}`));
      source.addEventListener("event", (m) => onEvent(eventFromJSON(JSON.parse(m.data).event)));
      source.addEventListener("dropped", (m) => onDropped && onDropped(JSON.parse(m.data).dropped));
      source.addEventListener("error", (m) => {
        if (m.data) {
          source.close();
          handle.closed = true;
          if (onError) onError(JSON.parse(m.data).message);
        } else if (this.userToken) {
          // The browser's own retry would present the used ticket again: ask for a new one.
          source.close();
          if (!handle.closed) setTimeout(open, STREAM_RETRY_MS);
        } else if (onError && source.readyState === EventSource.CLOSED) {
          onError("the stream was refused or closed");
        }
      });
    };
    open();
    return handle;
  }

  /**
   * Register an HTTP client: the router keeps the events matching its patterns until it
   * polls. Remembers the client's id and token for feed(), ack() and the pattern calls.
   */
  async registerClient({ name, patterns = [], policy, keepalive } = {}) {
    const body = { patterns: patterns.map(patternBody) };
    if (name !== undefined) body.name = name;
    if (policy !== undefined) body.policy = policy;
    if (keepalive !== undefined) body.keepalive = keepalive;
    const res = await this.request("POST", "/clients", { body: JSON.stringify(body) });
    this.clientId = res.id;
    this.token = res.token;
    return res;
  }

  addPattern(pattern) {
    return this.request("POST", `/clients/${this.clientId}/patterns`, {
      body: JSON.stringify(patternBody(pattern)),
      auth: true,
    });
  }

  removePattern(patternId) {
    return this.request("DELETE", `/clients/${this.clientId}/patterns/${patternId}`, { auth: true });
  }

  /** One page of the client's queued events: { cursor, more, entries: [{ patterns, event }] }. */
  async feed({ after, limit } = {}) {
    const q = new URLSearchParams();
    if (after !== undefined && after !== null) q.set("after", String(after));
    if (limit !== undefined) q.set("limit", String(limit));
    const res = await this.request("GET", `/clients/${this.clientId}/feed?${q}`, { auth: true });
    res.entries = res.entries.map((e) => ({ patterns: e.patterns, event: eventFromJSON(e.event) }));
    return res;
  }

  /** Acknowledge up to a cursor (number) or an event id (string): the router drops them. */
  ack(upto) {
    const body = typeof upto === "number" ? { cursor: upto } : { event: upto };
    return this.request("POST", `/clients/${this.clientId}/ack`, { body: JSON.stringify(body), auth: true });
  }

  async unregister() {
    await this.request("DELETE", `/clients/${this.clientId}`, { auth: true });
    this.clientId = this.token = null;
  }
}
