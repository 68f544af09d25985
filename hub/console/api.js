// The console's calls to the Hub: JSON under /ui/api/, the session cookie sent by the browser,
// the session's CSRF token on every mutating request.

let csrf = "";
let onSignedOut = () => {};

export function setSession(me, signedOut) {
  csrf = me ? me.csrf : "";
  if (signedOut) onSignedOut = signedOut;
}

export class ApiError extends Error {
  constructor(status, text) {
    super(text);
    this.status = status;
  }
}

async function answer(r) {
  if (r.status === 204) return null;
  let body = null;
  try {
    body = await r.json();
  } catch (_) {
    body = { error: r.statusText };
  }
  if (!r.ok) {
    if (r.status === 401) onSignedOut();
    throw new ApiError(r.status, (body && body.error) || r.statusText);
  }
  return body;
}

function url(path, query) {
  let u = "/ui/api/" + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
    const s = q.toString();
    if (s) u += "?" + s;
  }
  return u;
}

export async function get(path, query) {
  const r = await fetch(url(path, query), { credentials: "same-origin", headers: { accept: "application/json" } });
  return answer(r);
}

// A live stream (server-sent events) of the Hub; the browser reconnects by itself when it
// breaks (a Hub restart too). The caller closes it.
export function live(path, query) {
  return new EventSource(url(path, query));
}

// Why a stream ended, from its `end` event.
export function why(data) {
  try {
    return JSON.parse(data).error || "the stream ended";
  } catch (_) {
    return "the stream ended";
  }
}

export async function send(method, path, data) {
  const r = await fetch("/ui/api/" + path, {
    method,
    credentials: "same-origin",
    headers: { "content-type": "application/json", accept: "application/json", "x-csrf-token": csrf },
    body: data === undefined ? undefined : JSON.stringify(data),
  });
  return answer(r);
}

export async function signIn(token) {
  const r = await fetch("/ui/api/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", accept: "application/json" },
    body: JSON.stringify({ token }),
  });
  return answer(r);
}

export function path(...parts) {
  return parts.map((p) => encodeURIComponent(p)).join("/");
}

// Can this session do what needs `role` in its namespace? (The Hub decides; this only hides
// buttons that would be refused.)
export function can(me, role) {
  const order = ["viewer", "submitter", "deployer", "admin", "cluster-admin"];
  return order.indexOf(me.role) >= order.indexOf(role);
}
