// The one way the console builds DOM: elements from a tag, attributes and children, every
// string set as a text node. No HTML is ever parsed from data.

const SAFE_ATTRS = new Set([
  "class", "id", "type", "name", "value", "placeholder", "for", "role", "title", "lang",
  "autocomplete", "min", "max", "step", "rows", "colspan", "scope", "tabindex", "download",
  "aria-label", "aria-live", "aria-current", "aria-expanded", "aria-describedby",
  "data-testid", "data-kind", "data-depth", "data-state", "datetime", "required", "disabled",
  "checked", "selected", "hidden", "open",
]);

// A link target the console makes: an in-page route or a console API path; anything else
// (javascript:, another origin) becomes "#".
export function safeHref(href) {
  const s = String(href);
  return s.startsWith("#/") || s.startsWith("/ui/") ? s : "#";
}

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "on") {
      for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    } else if (k === "href") {
      el.setAttribute("href", safeHref(v));
    } else if (SAFE_ATTRS.has(k)) {
      el.setAttribute(k, v === true ? "" : String(v));
    } else {
      throw new Error("attribute not allowed: " + k);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.floor(s / 60) + "m ago";
  if (s < 86400) return Math.floor(s / 3600) + "h ago";
  return Math.floor(s / 86400) + "d ago";
}

export function when(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "";
}

export function duration(ms) {
  if (ms < 0) return "";
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return Math.floor(ms / 60000) + "m " + Math.round((ms % 60000) / 1000) + "s";
}

export function badge(state) {
  return h("span", { class: "badge state-" + String(state).replace(/[^a-z_-]/g, ""), "data-state": state }, state);
}

export function table(caption, headers, rows) {
  return h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows));
}

export function message(el, text, kind) {
  return replace(el, h("p", { class: kind || "note", role: kind === "error" ? "alert" : "status" }, text));
}
