// slidegate inspector: the top limited clients (GET /api/v1/top), loaded before app.js, whose
// helpers (el, api, $, select, updateHint, fillClient, routes) it uses when called.
"use strict";

const TOP_MINUTES = 5;

// One table per limited route: its clients most denied first (GET /api/v1/top), each key a
// link that opens its bucket below (the same as a deep link). Without keys
// (admin_show_keys = false) only the pk is shown, and nothing links.
function renderTop(route, reply) {
  const box = el("div", { class: "top-route", "data-top-route": route });
  const table = el("table");
  table.append(el("caption", {}, `${route}: ${reply.clients.length ? "" : "no client denied "}` +
    `over the last ${reply.minutes} min${reply.shared ? ", every proxy" : ", this proxy"}`));
  const head = el("tr");
  for (const [text, cls] of [["client", ""], ["pk", ""], ["denied", "num"], ["allowed", "num"], ["refused by", ""]]) {
    head.append(el("th", { scope: "col", class: cls }, text));
  }
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  for (const c of reply.clients) {
    const tr = el("tr", { "data-key": c.key === undefined ? "" : c.key, "data-pk": c.pk });
    const who = el("td");
    if (c.key !== undefined && c.inspectable) {
      const q = `route=${encodeURIComponent(route)}&client=${encodeURIComponent(c.key)}`;
      const a = el("a", { href: `?${q}`, class: "top-link" }, c.key === "" ? "(everyone)" : c.key);
      a.addEventListener("click", (ev) => {
        ev.preventDefault();
        $("#route").value = route;
        updateHint();
        fillClient(c.key);
        select(route, c.key, true);
      });
      who.append(a);
    } else {
      who.textContent = c.key === undefined ? "–" : c.key;
    }
    tr.append(who, el("td", { class: "pk" }, c.pk));
    tr.append(el("td", { class: "num deny" }, String(c.denied)), el("td", { class: "num" }, String(c.allowed)));
    tr.append(el("td", {}, c.limits.join(", ")));
    tbody.append(tr);
  }
  table.append(thead, tbody);
  box.append(table);
  return box;
}

// The replies last drawn: the tables are redrawn only when one changed, so a link is not
// replaced under the pointer every poll.
let topDrawn = null;

async function pollTop() {
  const limited = routes.filter((r) => r.limits.length && !r.shadow);
  const replies = [];
  for (const r of limited) {
    try {
      const q = `route=${encodeURIComponent(r.name)}&minutes=${TOP_MINUTES}`;
      replies.push([r.name, await api("GET", `/api/v1/top?${q}`), null]);
    } catch (e) {
      replies.push([r.name, null, e.message]);
    }
  }
  const drawn = JSON.stringify(replies);
  if (drawn === topDrawn) return;
  topDrawn = drawn;
  $("#top").replaceChildren(...replies.map(([name, reply, error]) => reply
    ? renderTop(name, reply)
    : el("p", { class: "error", "data-top-route": name }, `${name}: ${error}`)));
}

