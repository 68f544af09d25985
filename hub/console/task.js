// The Task page: state, activity, progress and outcome kept live by the Hub's WatchTask
// stream; the waiting calls (decided inline); the conversation, with the model's answer shown
// as it streams (WatchTask deltas, text only; a reset drops what was shown of that turn and
// later ones); the trace as a waterfall with the delegate children nested; the child tree;
// artifacts; the instance's log tail; cancel.

import { h, replace, message, badge, when, duration } from "./dom.js";
import * as api from "./api.js";
import { approvalCard } from "./approvals.js";
import { waterfall } from "./waterfall.js";

const ENDED = new Set(["succeeded", "failed", "cancelled"]);

function parse(json) {
  try {
    return JSON.parse(json);
  } catch (_) {
    return {};
  }
}

function text(v) {
  if (v === undefined || v === null) return "";
  return typeof v === "string" ? v : JSON.stringify(v, null, 2);
}

// One line of the conversation from a task event, or null for events it does not show.
function turn(ev) {
  const b = parse(ev.json);
  switch (ev.kind) {
    case "model.answered": {
      const m = b.message || {};
      const content = typeof m.content === "string" ? m.content : text(m.content);
      if (b.error) return ["model", "error: " + b.error];
      return content ? ["model", content] : null;
    }
    case "tool.started":
      return ["tool", b.tool + "(" + text(b.arguments) + ")"];
    case "tool.completed":
      return ["result", b.tool + " → " + text(b.result)];
    case "tool.failed":
      return ["result", b.tool + " failed (" + text(b.reason) + "): " + text(b.error)];
    case "approval.requested":
      return ["approval", "asks to run " + b.tool];
    case "approval.decided":
      return ["approval", (b.approved ? "approved" : "denied") + (b.by ? " by " + b.by : "") + (b.reason ? ": " + b.reason : "")];
    case "run.finished":
      return ["outcome", text(b.result)];
    default:
      return null;
  }
}

export function render(main, ctx) {
  const [namespace, taskId] = ctx.args;
  const head = h("section", { "aria-label": "Task" });
  const waiting = h("section", { "aria-label": "Waiting calls" });
  const convo = h("ol", { class: "conversation", "data-testid": "conversation" });
  // The answer being streamed: its text by turn, until the turn's answer is stored.
  const streaming = h("p", { class: "turn turn-model streaming", "data-testid": "streaming", "aria-live": "polite", hidden: true });
  const streamed = new Map();
  const trace = h("section", { "aria-label": "Trace" });
  const kids = h("section", { "aria-label": "Child tasks" });
  const files = h("section", { "aria-label": "Artifacts" });
  const logs = h("section", { "aria-label": "Log tail" });
  const status = h("div", { "aria-live": "polite" });
  replace(main, h("h1", {}, "Task ", h("code", {}, taskId)), status, head, waiting,
    h("h2", {}, "Conversation"), convo, streaming, h("h2", {}, "Trace"), trace, h("h2", {}, "Child tasks"), kids,
    h("h2", {}, "Artifacts"), files, h("h2", {}, "Log tail"), logs);

  let alive = true;
  let task = null;
  let traceTimer = null;
  let approvalsShown = null;
  const seen = new Set();

  function showTask(t) {
    task = t;
    const progress = t.progress ? [t.progress.step, t.progress.total ? t.progress.done + "/" + t.progress.total : "", t.progress.note].filter(Boolean).join(" · ") : "";
    const cancel = !ENDED.has(t.state) && api.can(ctx.me, "submitter")
      ? h("button", { type: "button", class: "danger", on: { click: async () => {
        try {
          await api.send("POST", "tasks/" + api.path(namespace, taskId) + "/cancel");
        } catch (e) {
          message(status, "Cancel refused: " + e.message, "error");
        }
      } } }, "Cancel task")
      : null;
    replace(head, h("dl", { class: "facts" },
      h("dt", {}, "State"), h("dd", { "data-testid": "task-state" }, badge(t.state)),
      h("dt", {}, "Deployment"), h("dd", {}, h("a", { href: "#/deployment/" + api.path(t.namespace, t.deployment) }, t.deployment)),
      h("dt", {}, "Activity"), h("dd", { "data-testid": "activity" }, t.activity),
      h("dt", {}, "Progress"), h("dd", {}, progress),
      h("dt", {}, "Attempt"), h("dd", {}, String(t.attempt)),
      h("dt", {}, "Submitted"), h("dd", {}, when(t.created_at_ms)),
      h("dt", {}, "Took"), h("dd", {}, t.finished_at_ms ? duration(t.finished_at_ms - (t.started_at_ms || t.created_at_ms)) : ""),
      t.parent_task_id ? [h("dt", {}, "Parent"), h("dd", {}, h("a", { href: "#/task/" + api.path(t.namespace, t.parent_task_id) }, t.parent_task_id))] : null,
      h("dt", {}, "Labels"), h("dd", {}, Object.entries(t.labels).map(([k, v]) => k + "=" + v).join(", ")),
      h("dt", {}, "Input"), h("dd", {}, h("pre", { "data-testid": "input" }, t.input)),
      h("dt", {}, "Outcome"), h("dd", {}, h("pre", { "data-testid": "outcome" }, t.error ? "error: " + t.error : t.result))),
    t.warnings.length ? h("ul", { class: "warnings" }, t.warnings.map((w) => h("li", {}, w))) : null,
    cancel);
    const key = t.pending_approvals.map((a) => a.call_id).join(",");
    if (key !== approvalsShown) {
      approvalsShown = key;
      replace(waiting, t.pending_approvals.length ? [h("h2", {}, "Waiting for a decision"), t.pending_approvals.map((a) => approvalCard(a, namespace, ctx.me))] : null);
    }
  }

  // The trace is read when the page opens and again after new events, at most once per
  // interval (twice its last load time, at least 500 ms); a trace whose task has ended and
  // has no span still running is final and never read again (a replay of its events changes
  // nothing), and an unchanged trace is not drawn again.
  let traceShown = "";
  let traceFinal = false;
  let traceEvery = 500;
  async function loadTrace() {
    traceTimer = null;
    const began = performance.now();
    try {
      const [detail, tr] = await Promise.all([
        api.get("tasks/" + api.path(namespace, taskId)),
        api.get("tasks/" + api.path(namespace, taskId) + "/trace"),
      ]);
      if (!alive) return;
      if (!task) showTask(detail.task);
      const root = tr.spans.find((s) => s.attributes && s.attributes.task_id === taskId);
      traceFinal = ENDED.has(detail.task.state) && !!root && ENDED.has(root.status)
        && !tr.spans.some((s) => s.status === "running");
      const text = JSON.stringify(tr);
      if (text !== traceShown) {
        traceShown = text;
        replace(trace, waterfall(tr, namespace));
      }
      replace(kids, detail.children.length ? h("ul", { class: "tree" }, detail.children.map((c) => h("li", {},
        h("a", { href: "#/task/" + api.path(c.namespace, c.task_id) }, c.task_id), " ", c.deployment, " ", badge(c.state)))) : h("p", { class: "note" }, "None."));
      replace(files, detail.artifacts.length ? h("ul", {}, detail.artifacts.map((a) => h("li", {},
        h("a", { href: "/ui/api/artifacts/" + api.path(namespace, a.artifact_id), download: a.name }, a.name), " (" + a.size + " bytes, " + a.media_type + ")"))) : h("p", { class: "note" }, "None."));
    } catch (e) {
      if (alive) message(trace, "Cannot load the trace: " + e.message, "error");
    }
    traceEvery = Math.max(500, 2 * (performance.now() - began));
  }
  async function loadLogs() {
    try {
      const lines = await api.get("tasks/" + api.path(namespace, taskId) + "/logs");
      if (alive) replace(logs, lines.length ? h("pre", { class: "logs" }, lines.map((l) => (l.server ? "[" + l.server + "] " : "") + (l.level ? l.level + " " : "") + l.text + "\n")) : h("p", { class: "note" }, "No log lines."));
    } catch (e) {
      if (alive) message(logs, "Cannot read the logs: " + e.message, "note");
    }
  }
  const soon = () => {
    if (!traceTimer && !traceFinal) traceTimer = setTimeout(loadTrace, traceEvery);
  };
  // The trace first, then the live events (a long run replays thousands of them, which
  // would otherwise compete with the trace for the Hub and the page).
  const first = loadTrace();
  loadLogs();

  // Events arrive in bursts (a replay of a long run is thousands): they are drawn once per
  // frame, the newest task snapshot and the new conversation lines together.
  let latest = null;
  let lines = [];
  let frame = 0;
  let streamChanged = false;
  const draw = () => {
    frame = 0;
    if (!alive) return;
    if (latest) showTask(latest);
    latest = null;
    if (lines.length) {
      convo.append(...lines);
      lines = [];
    }
    if (streamChanged) {
      streamChanged = false;
      const text = [...streamed.keys()].sort((a, b) => a - b).map((k) => streamed.get(k)).join("");
      streaming.textContent = text;
      streaming.hidden = !text;
    }
    if (task && ENDED.has(task.state) && live) {
      live.close();
      loadLogs();
    }
  };
  let live = null;
  const listen = () => {
    if (!alive) return;
    live = new EventSource("/ui/api/tasks/" + api.path(namespace, taskId) + "/live");
    live.addEventListener("task", onTask);
    live.addEventListener("delta", onDelta);
    live.addEventListener("end", onEnd);
  };
  first.finally(listen);
  const onTask = (m) => {
    const ev = JSON.parse(m.data);
    if (seen.has(ev.seq)) return;
    seen.add(ev.seq);
    if (ev.task) latest = ev.task;
    if (ev.kind === "model.answered" && streamed.size) {
      // Stored: the conversation shows it now.
      const t = parse(ev.json).turn;
      for (const k of [...streamed.keys()]) if (t === undefined || k <= t) streamed.delete(k);
      streamChanged = true;
    }
    const line = turn(ev);
    if (line) lines.push(h("li", { class: "turn turn-" + line[0] }, h("span", { class: "who" }, line[0]), " ", h("span", { class: "text" }, line[1])));
    soon();
    if (!frame) frame = requestAnimationFrame(draw);
  };
  const onDelta = (m) => {
    const d = JSON.parse(m.data).delta;
    if (!d) return;
    // A reset voids the turn and later ones; its text (a late watcher's catch-up) starts
    // the turn again.
    if (d.reset) for (const k of [...streamed.keys()]) if (k >= d.turn) streamed.delete(k);
    if (d.text) streamed.set(d.turn, (streamed.get(d.turn) || "") + d.text);
    streamChanged = true;
    if (!frame) frame = requestAnimationFrame(draw);
  };
  const onEnd = (m) => {
    const why = parse(m.data).error;
    if (why) message(status, "Live updates ended: " + why, "note");
  };
  return () => {
    alive = false;
    if (live) live.close();
    if (traceTimer) clearTimeout(traceTimer);
    if (frame) cancelAnimationFrame(frame);
  };
}
