// The console's shell: sign-in, the navigation, and the hash router that shows one page at a
// time (each page returns a function that stops its timers and live streams).

import { h, replace, message } from "./dom.js";
import * as api from "./api.js";
import * as fleet from "./fleet.js";
import * as tasks from "./tasks.js";
import * as task from "./task.js";
import * as approvals from "./approvals.js";
import * as deployment from "./deployment.js";
import * as audit from "./audit.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
let me = null;
let stop = () => {};

const PAGES = [
  ["fleet", "Fleet", fleet],
  ["tasks", "Tasks", tasks],
  ["approvals", "Approvals", approvals],
  ["audit", "Audit", audit],
];

function route() {
  const hash = location.hash.startsWith("#/") ? location.hash.slice(2) : "fleet";
  const [pathPart, queryPart] = hash.split("?");
  const parts = pathPart.split("/").map(decodeURIComponent);
  return { name: parts[0] || "fleet", args: parts.slice(1), query: new URLSearchParams(queryPart || "") };
}

function renderNav(current) {
  replace(nav, h("ul", {}, PAGES
    .filter(([name]) => name !== "audit" || api.can(me, "admin"))
    .map(([name, label]) => h("li", {}, h("a", {
      href: "#/" + name,
      "aria-current": current === name ? "page" : undefined,
    }, label)))));
  replace(who,
    h("span", { "data-testid": "whoami" }, me.name + " · " + me.role + (me.namespace ? " in " + me.namespace : "")),
    " ",
    h("button", { type: "button", class: "link", on: { click: signOut } }, "Sign out"));
}

async function signOut() {
  try {
    await api.send("DELETE", "session");
  } finally {
    me = null;
    showSignIn();
  }
}

function show() {
  stop();
  stop = () => {};
  if (!me) return showSignIn();
  const r = route();
  const page = {
    fleet, tasks, task, approvals, deployment, audit,
  }[r.name];
  renderNav(r.name === "task" ? "tasks" : r.name === "deployment" ? "fleet" : r.name);
  replace(main);
  if (!page) {
    message(main, "No such page: " + r.name, "error");
    return;
  }
  stop = page.render(main, { me, args: r.args, query: r.query }) || (() => {});
}

function showSignIn() {
  stop();
  stop = () => {};
  replace(nav);
  replace(who);
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true });
  const status = h("div", { "aria-live": "polite" });
  const form = h("form", { class: "signin", on: { submit: async (ev) => {
    ev.preventDefault();
    try {
      me = await api.signIn(input.value);
      api.setSession(me);
      input.value = "";
      show();
    } catch (e) {
      message(status, "Sign-in refused: " + e.message, "error");
    }
  } } },
  h("h1", {}, "Sign in to the Agen console"),
  h("p", {}, "Paste an API token (agen tokens create) or the admin token. It is exchanged for a session; the token itself is not kept in the browser."),
  h("label", { for: "token" }, "API token"),
  input,
  h("button", { type: "submit" }, "Sign in"),
  status);
  replace(main, form);
  input.focus();
}

async function start() {
  api.setSession(null, () => {
    if (me) {
      me = null;
      showSignIn();
    }
  });
  try {
    me = await api.get("session");
    api.setSession(me);
  } catch (_) {
    me = null;
  }
  show();
}

window.addEventListener("hashchange", () => {
  if (location.hash === "#main") return;
  show();
});
start();
