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

export async function get(path, query) {
  let url = "/ui/api/" + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
    const s = q.toString();
    if (s) url += "?" + s;
  }
  const r = await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } });
  return answer(r);
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
