// The Audit page (admin roles): the audit log, newest first, filtered by call, outcome and
// token name.

import { h, replace, message, table, when } from "./dom.js";
import * as api from "./api.js";

export function render(main, ctx) {
  const call = h("input", { id: "a-call", value: ctx.query.get("call") || "" });
  const outcome = h("input", { id: "a-outcome", value: ctx.query.get("outcome") || "", placeholder: "ok, permission_denied…" });
  const who = h("input", { id: "a-who", value: ctx.query.get("who") || "" });
  const list = h("div", {});
  let entries = [];
  const show = () => {
    const rows = entries.filter((e) => (!call.value || e.call.includes(call.value))
      && (!outcome.value || e.outcome === outcome.value)
      && (!who.value || e.token_name.includes(who.value)));
    replace(list, table("Audit log, newest first (" + rows.length + ")", ["When", "Token", "Namespace", "Call", "Target", "Outcome", "Message"],
      rows.map((e) => h("tr", { "data-testid": "audit-row" }, h("td", {}, when(e.at_ms)), h("td", {}, e.token_name), h("td", {}, e.namespace),
        h("td", {}, e.call), h("td", {}, e.target), h("td", {}, e.outcome), h("td", {}, e.message)))));
  };
  const form = h("form", { class: "filters", "aria-label": "Filters", on: { submit: (ev) => { ev.preventDefault(); show(); } } },
    h("div", { class: "field" }, h("label", { for: "a-call" }, "Call"), call),
    h("div", { class: "field" }, h("label", { for: "a-outcome" }, "Outcome"), outcome),
    h("div", { class: "field" }, h("label", { for: "a-who" }, "Token"), who),
    h("button", { type: "submit" }, "Filter"));
  replace(main, h("h1", {}, "Audit"), form, list);
  api.get("audit", { limit: 1000 }).then((all) => {
    entries = all.slice().reverse();
    show();
  }, (e) => message(list, "Cannot read the audit log: " + e.message, "error"));
  return () => {};
}
