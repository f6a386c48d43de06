// net.js — one call to a router, bounded in time: a router that answers slowly or not at all
// is given up after a timeout (AbortController), and one that answers something other than
// the API's JSON is an unreachable router, not a crash.

/** Milliseconds a call may take before the router counts as unreachable. */
export const TIMEOUT = 6000;
/** Longest answer read, in characters: a feed page of 100 events is far below. */
const MAX_ANSWER = 8 * 1024 * 1024;

/** The router could not be reached, timed out or answered garbage: try another. */
export class Unreachable extends Error {}

/** The router answered with an error: `status`, `code`, `message` (its own words). */
export class Refused extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * `method path` on the router at *base*; resolves to the JSON answer (null for 204).
 * *body* is JSON text; *token* goes as `Authorization: Bearer`.
 */
export async function call(base, method, path, { body, token, timeout = TIMEOUT } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token) headers.Authorization = `Bearer ${token}`;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeout);
  let text;
  let res;
  try {
    res = await fetch(base + path, {
      method,
      headers,
      body,
      signal: abort.signal,
      credentials: "omit", // tokens only: no cookie or cached password goes anywhere
      cache: "no-store",
      referrerPolicy: "no-referrer",
    });
    text = await res.text();
  } catch (err) {
    throw new Unreachable(err && err.name === "AbortError" ? `no answer within ${timeout / 1000} s` : "unreachable");
  } finally {
    clearTimeout(timer);
  }
  if (res.status === 204) return null;
  let data = null;
  if (text.length <= MAX_ANSWER) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (res.ok) {
    if (data === null || typeof data !== "object") throw new Unreachable(`answered something that is not the API's JSON (${res.status})`);
    return data;
  }
  if (data && typeof data === "object" && typeof data.message === "string") {
    throw new Refused(res.status, String(data.error || "error"), data.message.slice(0, 2000));
  }
  if (res.status >= 500 || res.status === 404) throw new Unreachable(`answered ${res.status} without the API's error`);
  throw new Refused(res.status, "error", `${res.status} ${res.statusText}`.trim());
}
