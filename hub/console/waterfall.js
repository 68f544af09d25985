// A trace as a waterfall: one row per span (the run, model turns, tool calls, approvals), its
// bar placed on the task's time axis, with duration, attempt and effect_unknown marked; the
// delegate children's spans nested under the call that made them.

import { h, duration } from "./dom.js";

function kindOf(span) {
  if (span.name.startsWith("model") || span.name === "flow agent") return "model";
  if (span.name.startsWith("tool")) return "tool";
  if (span.name.startsWith("approval")) return "approval";
  return "task";
}

// Rows (span, depth) of one trace in start order, children under their parents.
function ordered(all, depth) {
  const byId = new Map();
  for (const s of all) if (!byId.has(s.span_id)) byId.set(s.span_id, s);
  const spans = [...byId.values()];
  const ids = new Set(spans.map((s) => s.span_id));
  const kids = new Map();
  const roots = [];
  for (const s of spans) {
    if (s.parent_span_id && ids.has(s.parent_span_id)) {
      if (!kids.has(s.parent_span_id)) kids.set(s.parent_span_id, []);
      kids.get(s.parent_span_id).push(s);
    } else roots.push(s);
  }
  const out = [];
  const walk = (s, d) => {
    out.push({ span: s, depth: d });
    for (const c of (kids.get(s.span_id) || []).sort((a, b) => a.start_ms - b.start_ms)) walk(c, d + 1);
  };
  for (const r of roots.sort((a, b) => a.start_ms - b.start_ms)) walk(r, depth);
  return out;
}

// `trace`: the task's, which holds its delegation subtree (each child's spans under the call
// that made it); `namespace`: where the tasks are (for the links to the children).
export function waterfall(trace, namespace) {
  const rows = ordered(trace.spans, 0);
  if (!rows.length) return h("p", { class: "note" }, "No spans yet.");
  // One pass for the time axis (no spread of a thousand arguments).
  let start = Infinity;
  let end = -Infinity;
  for (const r of rows) {
    if (r.span.start_ms > 0 && r.span.start_ms < start) start = r.span.start_ms;
    end = Math.max(end, r.span.end_ms, r.span.start_ms);
  }
  if (start === Infinity) start = 0;
  const total = Math.max(1, end - start);
  // Rows are built off the document and attached once; the table's fixed layout sizes its
  // columns from the header, not from every cell, so a thousand rows lay out in one pass.
  const body = h("tbody", {});
  const built = document.createDocumentFragment();
  for (const r of rows) {
    const s = r.span;
    const delegate = kindOf(s) === "task" && r.depth > 0;
    const kind = delegate ? "delegate" : kindOf(s);
    const a = s.attributes || {};
    const ms = Math.max(0, s.end_ms - s.start_ms);
    const bar = h("span", { class: "bar kind-" + kind + " status-" + String(s.status).replace(/[^a-z_]/g, "") });
    bar.style.marginLeft = ((Math.max(0, s.start_ms - start) / total) * 100).toFixed(2) + "%";
    bar.style.width = Math.max(0.5, (ms / total) * 100).toFixed(2) + "%";
    const marks = [];
    if (a.attempt && Number(a.attempt) > 1) marks.push(h("span", { class: "mark" }, "attempt " + a.attempt));
    if (a.reason === "effect_unknown") marks.push(h("span", { class: "mark warn", "data-testid": "effect-unknown" }, "effect unknown"));
    else if (a.reason) marks.push(h("span", { class: "mark" }, a.reason));
    if (a.by) marks.push(h("span", { class: "mark" }, "by " + a.by));
    const name = delegate && a.task_id
      ? h("a", { href: "#/task/" + encodeURIComponent(namespace) + "/" + encodeURIComponent(a.task_id) }, "delegate " + s.name)
      : s.name;
    const cell = h("td", { class: "wf-name depth-" + Math.min(r.depth, 6) }, name, " ", marks);
    built.appendChild(h("tr", { class: "wf-row", "data-kind": kind, "data-depth": r.depth, title: a.arguments || "" },
      cell,
      h("td", { class: "wf-status" }, s.status),
      h("td", { class: "wf-dur", "data-testid": "duration" }, duration(ms)),
      h("td", { class: "wf-bar" }, bar)));
  }
  body.appendChild(built);
  return h("table", { class: "waterfall", "data-testid": "waterfall" },
    h("caption", {}, "Trace (" + rows.length + " spans, " + duration(total) + ")"),
    h("thead", {}, h("tr", {},
      h("th", { scope: "col", class: "wf-name-col" }, "Span"),
      h("th", { scope: "col", class: "wf-status-col" }, "Status"),
      h("th", { scope: "col", class: "wf-dur-col" }, "Duration"),
      h("th", { scope: "col", class: "wf-bar-col" }, "Timeline"))),
    body);
}
