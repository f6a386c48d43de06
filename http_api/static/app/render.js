// render.js — events as a person reads them, built with DOM calls and textContent only: no
// event's text is ever parsed as HTML. Everything is bounded: text is cut, nesting is folded
// and cut at a depth, lists and maps show their first entries.

import { fromTyped } from "/static/aa.js";

/** Limits of the list (short) and of the detail view (full). */
export const SHORT = { text: 120, depth: 2, items: 6 };
export const FULL = { text: 20000, depth: 12, items: 500 };

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

export function cut(text, n) {
  const s = String(text);
  return s.length > n ? `${s.slice(0, n)}… (${s.length.toLocaleString()} characters)` : s;
}

export function size(n) {
  if (n < 1024) return `${n} bytes`;
  const units = ["KiB", "MiB", "GiB"];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u += 1;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]} (${n.toLocaleString()} bytes)`;
}

export function when(date) {
  return Number.isNaN(date.getTime()) ? String(date.aaIso || "invalid time") : date.toLocaleString();
}

/** A value (decoded from typed JSON) as a DOM node, within *limits*. */
export function valueNode(value, limits = SHORT, depth = 0) {
  if (value === null || value === undefined) return el("span", "v-none", "none");
  if (typeof value === "boolean") return el("span", "v-bool", value ? "yes" : "no");
  if (typeof value === "number") return el("span", "v-num", value.toLocaleString(undefined, { maximumFractionDigits: 6 }));
  if (typeof value === "string") return el("span", "v-text", cut(value, limits.text));
  if (value instanceof Date) return el("span", "v-time", when(value));
  if (value instanceof Uint8Array) return el("span", "v-bytes", size(value.length));
  const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
  const n = entries.length;
  const label = Array.isArray(value) ? `${n} ${n === 1 ? "item" : "items"}` : `${n} ${n === 1 ? "field" : "fields"}`;
  if (depth >= limits.depth) return el("span", "v-fold", `{${label}}`);
  const box = el("details", "v-nest");
  box.append(el("summary", null, label));
  const list = el("dl");
  for (const [k, v] of entries.slice(0, limits.items)) {
    list.append(el("dt", null, cut(k, 60)));
    const dd = el("dd");
    dd.append(valueNode(v, limits, depth + 1));
    list.append(dd);
  }
  if (entries.length > limits.items) list.append(el("dt", "more", `… ${entries.length - limits.items} more`));
  box.append(list);
  return box;
}

/** The parts of a stored event (typed JSON as the router sent it) that a person reads. */
export function readable(raw) {
  const values = fromTyped(raw.values || {});
  const meta = fromTyped(raw.meta || {});
  const time = meta.time instanceof Date ? meta.time : null;
  return { id: String(raw.id || ""), type: raw.type == null ? null : String(raw.type), values, meta, time };
}

/** One row of the list: type, user, time, the first values. */
export function eventRow(row) {
  const e = readable(row.event);
  const li = el("li", "event");
  li.dataset.id = cut(e.id, 200);
  const head = el("div", "event-head");
  head.append(el("span", "type", e.type === null ? "(no type)" : cut(e.type, 60)));
  head.append(el("span", "user", cut(e.meta.user || "anonymous", 40)));
  head.append(el("time", null, e.time ? when(e.time) : ""));
  li.append(head);
  const dl = el("dl", "values");
  const names = Object.keys(e.values);
  for (const name of names.slice(0, SHORT.items)) {
    dl.append(el("dt", null, cut(name, 40)));
    const dd = el("dd");
    dd.append(valueNode(e.values[name], SHORT, 1));
    dl.append(dd);
  }
  if (names.length > SHORT.items) dl.append(el("dt", "more", `… ${names.length - SHORT.items} more`));
  li.append(dl);
  return li;
}

/** Everything of an event: values in full (within FULL), then its metadata. */
export function eventDetail(row) {
  const e = readable(row.event);
  const box = el("div", "detail");
  box.append(el("h2", null, e.type === null ? "(no type)" : cut(e.type, 200)));
  const facts = el("dl", "facts");
  const fact = (k, v) => {
    facts.append(el("dt", null, k));
    facts.append(el("dd", null, v));
  };
  fact("id", cut(e.id, 300));
  fact("published by", cut(e.meta.user || "anonymous", 200));
  if (e.time) fact("time", when(e.time));
  fact("came through", cut(row.router || "", 200));
  box.append(facts);
  box.append(el("h3", null, "Values"));
  box.append(valueNode(e.values, { ...FULL }, 0));
  box.append(el("h3", null, "Metadata"));
  box.append(valueNode(e.meta, { ...FULL }, 0));
  for (const d of box.querySelectorAll("details")) d.open = true;
  return box;
}
