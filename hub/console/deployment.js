// The Deployment page: its instances, its generations (who deployed what), its A2A card URL,
// and scale / rollback for deployer tokens. Read again when the Hub's WatchDeployments /
// WatchNests streams say the fleet changed (server-sent events).

import { h, replace, message, badge, table, when } from "./dom.js";
import * as api from "./api.js";

export function render(main, ctx) {
  const [namespace, name] = ctx.args;
  const body = h("div", {});
  const status = h("div", { "aria-live": "polite" });
  replace(main, h("h1", {}, "Deployment ", h("code", {}, namespace + "/" + name)), status, body);
  let alive = true;
  const base = "deployments/" + api.path(namespace, name);
  async function load() {
    try {
      const p = await api.get(base);
      if (!alive) return;
      const d = p.deployment || {};
      const replicas = h("input", { id: "replicas", type: "number", min: "0", value: String(d.replicas || 0) });
      const controls = api.can(ctx.me, "deployer") ? h("form", { class: "actions", on: { submit: async (ev) => {
        ev.preventDefault();
        try {
          await api.send("POST", base + "/scale", { replicas: Number(replicas.value) });
          message(status, "Scaled to " + replicas.value + ".");
          load();
        } catch (e) {
          message(status, "Scale refused: " + e.message, "error");
        }
      } } }, h("label", { for: "replicas" }, "Replicas"), replicas, h("button", { type: "submit" }, "Scale")) : null;
      replace(body,
        h("dl", { class: "facts" },
          h("dt", {}, "Ready / desired"), h("dd", {}, d.ready_replicas + " / " + d.replicas),
          h("dt", {}, "Generation"), h("dd", {}, String(d.generation)),
          h("dt", {}, "Agent"), h("dd", {}, d.agent_name),
          h("dt", {}, "Bundle"), h("dd", {}, h("code", {}, d.bundle_digest)),
          h("dt", {}, "A2A card"), h("dd", {}, h("code", {}, d.a2a_card_url))),
        controls,
        table("Instances", ["Instance", "Nest", "State", "Generation", "Tools", "Servers not connected", "Runs", "Restarts", "Message"],
          p.instances.map((i) => h("tr", {},
            h("td", {}, h("code", {}, i.instance_id)), h("td", {}, i.nest_name), h("td", {}, badge(i.state)),
            h("td", {}, String(i.generation)), h("td", {}, String(i.tools_loaded)),
            h("td", {}, i.servers_not_connected.map((s) => s.server + ": " + s.reason).join("; ")),
            h("td", {}, String(i.active_runs)), h("td", {}, String(i.restarts)), h("td", {}, i.message)))),
        table("Generations", ["Generation", "Change", "By", "When", "Bundle", "Replicas", ""],
          p.revisions.slice().reverse().map((r) => h("tr", {},
            h("td", {}, String(r.generation) + (r.current ? " (current)" : "")), h("td", {}, r.change),
            h("td", {}, r.deployed_by), h("td", {}, when(r.created_at_ms)), h("td", {}, h("code", {}, r.bundle_digest.slice(0, 19))),
            h("td", {}, String(r.replicas)),
            h("td", {}, !r.current && api.can(ctx.me, "deployer") ? h("button", { type: "button", on: { click: async () => {
              try {
                await api.send("POST", base + "/rollback", { to_generation: r.generation });
                message(status, "Rolled back to generation " + r.generation + ".");
                load();
              } catch (e) {
                message(status, "Rollback refused: " + e.message, "error");
              }
            } } }, "Roll back to this") : "")))));
    } catch (e) {
      if (alive) message(body, "Cannot load the deployment: " + e.message, "error");
    }
  }
  load();
  let pending = null;
  const nudge = () => {
    if (!pending) pending = setTimeout(() => { pending = null; load(); }, 200);
  };
  const live = api.live("live/fleet");
  live.addEventListener("deployments", nudge);
  live.addEventListener("nests", nudge);
  return () => {
    alive = false;
    live.close();
    if (pending) clearTimeout(pending);
  };
}
