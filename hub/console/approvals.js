// The Approvals page: every call waiting for a person, with approve, approve always and deny
// with a reason (the task page shows the same card inline). Live: the Hub sends the list again
// whenever a waiting task changes (server-sent events fed by its WatchTasks stream).

import { h, replace, message, ago, clear } from "./dom.js";
import * as api from "./api.js";

function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch (_) {
    return json;
  }
}

// One waiting call. A session that may not decide (a viewer) gets no buttons.
export function approvalCard(a, namespace, me, done) {
  const status = h("div", { "aria-live": "polite" });
  const reason = h("input", { name: "reason", id: "reason-" + a.call_id, placeholder: "why (told to the model)" });
  const decide = async (approved, always) => {
    try {
      await api.send("POST", "approvals/decide", {
        namespace, task_id: a.task_id, call_id: a.call_id, approved, always, reason: approved ? "" : reason.value,
      });
      message(status, approved ? "Approved." : "Denied.");
      if (done) done();
    } catch (e) {
      message(status, "Refused: " + e.message, "error");
    }
  };
  const actions = api.can(me, "submitter")
    ? h("div", { class: "actions" },
      h("button", { type: "button", "data-testid": "approve", on: { click: () => decide(true, false) } }, "Approve"),
      h("button", { type: "button", "data-testid": "approve-always", on: { click: () => decide(true, true) } }, "Approve always"),
      h("label", { for: "reason-" + a.call_id }, "Reason"),
      reason,
      h("button", { type: "button", class: "danger", "data-testid": "deny", on: { click: () => decide(false, false) } }, "Deny"))
    : h("p", { class: "note" }, "Your token may not decide approvals.");
  return h("article", { class: "approval", "data-testid": "approval" },
    h("h3", {}, "Tool ", h("code", {}, a.tool)),
    h("p", {}, "Task ", h("a", { href: "#/task/" + api.path(namespace, a.task_id) }, a.task_id), " · ", a.deployment, " · asked ", ago(a.asked_at_ms)),
    h("pre", { class: "args" }, pretty(a.arguments_json)),
    actions,
    status);
}

export function render(main, ctx) {
  const namespace = ctx.query.get("namespace") || ctx.me.namespace || "default";
  const list = h("div", {});
  replace(main, h("h1", {}, "Approvals"), h("p", { class: "note" }, "Namespace " + namespace), list);
  let shown = "";
  const live = api.live("live/approvals", { namespace });
  live.addEventListener("approvals", (m) => {
    const all = JSON.parse(m.data);
    const key = all.map((a) => a.task_id + "/" + a.call_id).join(",");
    if (key === shown) return;
    shown = key;
    clear(list);
    if (!all.length) list.appendChild(h("p", { class: "note" }, "Nothing is waiting for a decision."));
    for (const a of all) list.appendChild(approvalCard(a, namespace, ctx.me));
  });
  live.addEventListener("end", (m) => message(list, "Cannot list approvals: " + api.why(m.data), "error"));
  return () => live.close();
}
