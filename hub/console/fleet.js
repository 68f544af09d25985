// The Fleet page: Nests (for the cluster admin) and deployments with their instances, kept
// live by the Hub's WatchNests / WatchDeployments streams.

import { h, replace, message, badge, table, ago } from "./dom.js";
import * as api from "./api.js";

function labels(map) {
  return Object.entries(map || {}).map(([k, v]) => k + "=" + v).join(", ");
}

function nestRow(n) {
  const flags = [n.cordoned ? "cordoned" : "", n.draining_until_ms ? "draining" : "", n.revoked ? "revoked" : ""].filter(Boolean).join(", ");
  return h("tr", {},
    h("td", {}, n.name), h("td", {}, badge(n.state)), h("td", {}, n.instances + " / " + n.capacity),
    h("td", {}, labels(n.labels)), h("td", {}, n.version), h("td", {}, n.separation),
    h("td", {}, flags), h("td", {}, ago(n.last_heartbeat_ms)));
}

function deploymentRow(d, instances) {
  const mine = instances.filter((i) => i.namespace === d.namespace && i.deployment === d.name);
  const tools = mine.reduce((n, i) => Math.max(n, i.tools_loaded), 0);
  const problems = mine.flatMap((i) => i.servers_not_connected.map((p) => p.server + ": " + p.reason));
  return h("tr", {},
    h("td", {}, h("a", { href: "#/deployment/" + api.path(d.namespace, d.name) }, d.namespace + "/" + d.name)),
    h("td", { "data-testid": "ready" }, d.ready_replicas + " / " + d.replicas),
    h("td", {}, String(d.generation)),
    h("td", {}, String(tools)),
    h("td", {}, problems.length ? h("ul", {}, problems.map((p) => h("li", {}, p))) : "none"),
    h("td", {}, labels(d.selector)),
    h("td", {}, h("a", { href: "#/tasks?deployment=" + encodeURIComponent(d.name) + "&namespace=" + encodeURIComponent(d.namespace) }, "tasks")));
}

export function render(main, ctx) {
  const nests = h("section", { "aria-label": "Nests" });
  const deps = h("section", { "aria-label": "Deployments" });
  replace(main, h("h1", {}, "Fleet"), nests, deps);
  let alive = true;
  let pending = null;
  async function load() {
    pending = null;
    try {
      const f = await api.get("fleet");
      if (!alive) return;
      replace(nests, f.nests_hidden
        ? h("p", { class: "note" }, "Nests: only the cluster admin sees them.")
        : table("Nests", ["Name", "State", "Instances / capacity", "Labels", "Version", "Separation", "Cordon / drain", "Heartbeat"], f.nests.map(nestRow)));
      replace(deps, f.deployments.length
        ? table("Deployments", ["Deployment", "Ready / desired", "Generation", "Tools loaded", "Servers not connected", "Selector", ""], f.deployments.map((d) => deploymentRow(d, f.instances)))
        : h("p", { class: "note" }, "No deployments yet (agen deploy)."));
    } catch (e) {
      if (alive) message(deps, "Cannot load the fleet: " + e.message, "error");
    }
  }
  load();
  const live = new EventSource("/ui/api/live/fleet");
  const nudge = () => {
    if (!pending) pending = setTimeout(load, 200);
  };
  live.addEventListener("deployments", nudge);
  live.addEventListener("nests", nudge);
  live.addEventListener("open", nudge);
  return () => {
    alive = false;
    live.close();
    if (pending) clearTimeout(pending);
  };
}
