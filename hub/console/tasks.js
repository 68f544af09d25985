// The Tasks page: filters (namespace, deployment, state, label, parent, time), paging and the
// count of matches; the shown page is live: the Hub sends it again whenever it changes
// (server-sent events from its WatchTasks stream; the browser reconnects by itself).

import { h, replace, message, badge, table, ago } from "./dom.js";
import * as api from "./api.js";

const STATES = ["", "queued", "running", "waiting", "succeeded", "failed", "cancelled"];
const FIELDS = ["namespace", "deployment", "state", "label", "parent", "since", "until"];

function toMs(local) {
  if (!local) return "";
  const t = Date.parse(local);
  return Number.isFinite(t) ? String(t) : "";
}

export function render(main, ctx) {
  const q = ctx.query;
  const inputs = {};
  const field = (name, label, el) => {
    inputs[name] = el;
    el.id = "f-" + name;
    return h("div", { class: "field" }, h("label", { for: "f-" + name }, label), el);
  };
  const stateSelect = h("select", { name: "state" }, STATES.map((s) => h("option", { value: s, selected: q.get("state") === s }, s || "any")));
  const form = h("form", { class: "filters", "aria-label": "Filters", on: { submit: (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const f of FIELDS) if (inputs[f] && inputs[f].value) next.set(f, inputs[f].value);
    location.hash = "#/tasks?" + next.toString();
  } } },
  ctx.me.role === "cluster-admin" ? field("namespace", "Namespace", h("input", { name: "namespace", value: q.get("namespace") || "", placeholder: "default" })) : null,
  field("deployment", "Deployment", h("input", { name: "deployment", value: q.get("deployment") || "" })),
  field("state", "State", stateSelect),
  field("label", "Label", h("input", { name: "label", value: q.get("label") || "", placeholder: "key=value" })),
  field("parent", "Parent task", h("input", { name: "parent", value: q.get("parent") || "" })),
  field("since", "Submitted from", h("input", { name: "since", type: "datetime-local", value: q.get("since") || "" })),
  field("until", "Submitted before", h("input", { name: "until", type: "datetime-local", value: q.get("until") || "" })),
  h("button", { type: "submit" }, "Filter"));
  const count = h("p", { "aria-live": "polite", "data-testid": "count" });
  const list = h("div", {});
  const pager = h("div", { class: "pager" });
  replace(main, h("h1", {}, "Tasks"), form, count, list, pager);

  let token = "";
  const history = [];
  let live = null;
  function show(page) {
    replace(count, page.total + " matching task" + (page.total === 1 ? "" : "s"));
    replace(list, page.tasks.length ? table("Tasks, newest first", ["Task", "Deployment", "State", "Activity", "Input", "Labels", "Submitted"],
      page.tasks.map((t) => h("tr", { "data-testid": "task-row" },
        h("td", {}, h("a", { href: "#/task/" + api.path(t.namespace, t.task_id) }, t.task_id)),
        h("td", {}, t.deployment),
        h("td", {}, badge(t.state)),
        h("td", {}, t.activity),
        h("td", { class: "cut" }, t.input),
        h("td", {}, Object.entries(t.labels).map(([k, v]) => k + "=" + v).join(", ")),
        h("td", {}, ago(t.created_at_ms))))) : h("p", { class: "note" }, "No tasks match."));
    replace(pager,
      h("button", { type: "button", disabled: history.length === 0, on: { click: () => { token = history.pop() || ""; connect(); } } }, "Previous page"),
      " ",
      h("button", { type: "button", disabled: !page.next_page_token, on: { click: () => { history.push(token); token = page.next_page_token; connect(); } } }, "Next page"));
  }
  function connect() {
    if (live) live.close();
    live = api.live("live/tasks", {
      namespace: q.get("namespace"), deployment: q.get("deployment"), state: q.get("state"),
      label: q.get("label"), parent: q.get("parent"), since_ms: toMs(q.get("since")),
      until_ms: toMs(q.get("until")), page_size: 50, page_token: token,
    });
    live.addEventListener("tasks", (m) => show(JSON.parse(m.data)));
    live.addEventListener("end", (m) => message(list, "Cannot list tasks: " + api.why(m.data), "error"));
  }
  connect();
  return () => {
    if (live) live.close();
  };
}
