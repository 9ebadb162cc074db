// slidegate inspector. Polls the admin API of the origin that served this page:
//   /api/v1/routes every 2 s (rates from counter deltas), /api/v1/window every 500 ms for the
//   selected bucket, and animates between polls on the store's clock (now_ms + time since the
//   reply arrived), so entries slide along the axis and the ring counts down smoothly.
"use strict";

const ROUTES_EVERY_MS = 2000;
const WINDOW_EVERY_MS = 500;
const TOP_EVERY_MS = 2000; // top.js: pollTop
const SVG = "http://www.w3.org/2000/svg";
const RING_R = 50;
const RING_C = 2 * Math.PI * RING_R;

const $ = (sel) => document.querySelector(sel);
let routes = [];
let prevCounts = null; // { at, byRoute: {name: {allowed, denied}} }
let selected = null; // { route, client }
let view = null; // last /api/v1/window reply
let viewAt = 0; // performance.now() when it arrived
let cards = []; // per limit: elements updated by animate()

function el(tag, attrs = {}, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function status(text, isError = false) {
  const s = $("#status");
  s.textContent = text;
  s.classList.toggle("error", isError);
}

async function api(method, path) {
  // Writes say they are JSON: the admin port refuses form content types (CSRF), and a
  // cross-site page cannot send this type without a CORS preflight, which nothing answers.
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers });
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    const detail = body && body.detail ? body.detail : resp.statusText;
    throw new Error(`${resp.status}: ${detail}`);
  }
  return body;
}

function fmtSecs(ms) {
  if (ms >= 10000) return (ms / 1000).toFixed(0) + " s";
  return (ms / 1000).toFixed(2) + " s";
}

// An axis label: as few digits as the value needs ("5 s", "2.5 s", "250 ms").
function fmtSpan(ms) {
  if (ms < 1000) return `${+ms.toFixed(1)} ms`;
  return `${+(ms / 1000).toFixed(2)} s`;
}

function fmtWindow(ms) {
  if (ms % 3600000 === 0) return ms / 3600000 + "h";
  if (ms % 60000 === 0) return ms / 60000 + "m";
  if (ms % 1000 === 0) return ms / 1000 + "s";
  return ms + "ms";
}

// ---- routes table -------------------------------------------------------------------------

function renderRoutes(rates) {
  const tbody = $("#routes tbody");
  tbody.replaceChildren();
  for (const r of routes) {
    const tr = el("tr", { "data-route": r.name });
    const name = el("th", { scope: "row" }, r.name);
    if (r.shadow) name.append(" ", el("span", { class: "shadow-tag", title: "shadow: never denies" }, "shadow"));
    tr.append(name, el("td", {}, r.key));
    const list = (ls) => ls.length
      ? ls.map((l) => `${l.requests} per ${fmtWindow(l.window_ms)}`).join(", ")
      : "none";
    // A route with plans: each plan's limits (the bucket view names the client's plan).
    const limits = r.plans
      ? r.plans.map((p) => `${p.name}: ${list(p.limits)}`).join("; ")
      : list(r.limits);
    tr.append(el("td", {}, limits));
    const rate = rates[r.name];
    tr.append(el("td", { class: "num rate-allowed" }, rate ? rate.allowed.toFixed(1) : "–"));
    tr.append(el("td", { class: "num rate-denied" + (rate && rate.denied > 0 ? " deny" : "") },
      rate ? rate.denied.toFixed(1) : "–"));
    tr.append(el("td", { class: "num" }, String(r.allowed)), el("td", { class: "num" }, String(r.denied)));
    const link = el("a", { href: `?route=${encodeURIComponent(r.name)}` }, "inspect");
    link.setAttribute("aria-label", `inspect route ${r.name}`);
    link.addEventListener("click", (ev) => {
      ev.preventDefault();
      $("#route").value = r.name;
      updateHint();
      (partInputs()[0] || $("#client")).focus();
    });
    const td = el("td");
    td.append(link);
    tr.append(td);
    tbody.append(tr);
  }
}

function fillRouteSelect() {
  const select = $("#route");
  const current = select.value || (selected && selected.route) || "";
  select.replaceChildren();
  for (const r of routes) select.append(el("option", { value: r.name }, r.name));
  if (current) select.value = current;
  updateHint();
}

// What a client field takes, by the kind of the key or part (sent as JSON, never parsed here).
function keyHint(key) {
  switch (key.kind) {
    case "client_ip": return "(an IP address)";
    case "global": return "(leave empty: one bucket for everyone)";
    case "header": return `(the value of ${key.name})`;
    case "query": return `(the decoded value of ?${key.name}=)`;
    case "cookie": return `(the value of cookie ${key.name})`;
    case "method": return "(a method, e.g. GET)";
    case "path": return "(a path, e.g. /login)";
    default: return "";
  }
}

function partText(part) {
  return part.name === undefined ? part.kind : `${part.kind}:${part.name}`;
}

// A composite key has one field per part; the client sent to the API is their JSON list. A part
// a request may lack (header, query, cookie) takes {"ip": "<addr>"} for the bucket the proxy
// counted such a request under.
function partInputs() {
  return [...document.querySelectorAll("#parts input")];
}

function routeKey() {
  const r = routes.find((x) => x.name === $("#route").value);
  return r ? r.key_spec : null;
}

function updateHint() {
  const key = routeKey();
  const composite = !!key && key.kind === "composite";
  $("#client").hidden = composite;
  $("#client-label").hidden = composite;
  $("#client-hint").textContent = key && !composite ? keyHint(key) : "";
  const box = $("#parts");
  box.replaceChildren();
  if (!composite) return;
  key.parts.forEach((part, i) => {
    const may = ["header", "query", "cookie"].includes(part.kind);
    const hint = keyHint(part).replace(/\)$/, may ? ', or {"ip": "…"} if the request lacked it)' : ")");
    const label = el("label", { for: `part-${i}` }, partText(part) + " ");
    label.append(el("span", { class: "hint" }, hint));
    box.append(label, el("input", { id: `part-${i}`, "data-part": partText(part),
      autocomplete: "off", spellcheck: "false" }));
  });
}

// The client text of the form: the field, or the parts' JSON list.
function formClient() {
  const inputs = partInputs();
  if (!inputs.length) return $("#client").value.trim();
  return JSON.stringify(inputs.map((input) => {
    const v = input.value.trim();
    if (v.startsWith("{")) {
      try { return JSON.parse(v); } catch (_) { /* sent as text: the API says what is wrong */ }
    }
    return v;
  }));
}

// Fill the fields from a client text (a deep link).
function fillClient(client) {
  const inputs = partInputs();
  if (!inputs.length) {
    $("#client").value = client;
    return;
  }
  let list = [];
  try { list = JSON.parse(client); } catch (_) { list = []; }
  inputs.forEach((input, i) => {
    const v = Array.isArray(list) ? list[i] : undefined;
    input.value = v === undefined ? "" : typeof v === "string" ? v : JSON.stringify(v);
  });
}

async function pollRoutes() {
  try {
    const first = routes.length === 0;
    routes = await api("GET", "/api/v1/routes");
    const now = performance.now();
    const byRoute = {};
    for (const r of routes) byRoute[r.name] = { allowed: r.allowed, denied: r.denied };
    const rates = {};
    if (prevCounts) {
      const dt = (now - prevCounts.at) / 1000;
      for (const r of routes) {
        const p = prevCounts.byRoute[r.name];
        if (p && dt > 0) {
          rates[r.name] = {
            allowed: Math.max(0, r.allowed - p.allowed) / dt,
            denied: Math.max(0, r.denied - p.denied) / dt,
          };
        }
      }
    }
    prevCounts = { at: now, byRoute };
    renderRoutes(rates);
    if (first) fillRouteSelect();
  } catch (e) {
    status(`routes: ${e.message}`, true);
  }
}

// ---- bucket view --------------------------------------------------------------------------

function buildCards() {
  const box = $("#limits");
  box.replaceChildren();
  cards = [];
  if (!view) return;
  for (const l of view.limits) {
    const card = el("article", { class: "limit", "data-limit": l.name });
    const h3 = el("h3", {}, l.name);
    const remaining = el("span", { class: "remaining" });
    h3.append(remaining);
    card.append(h3);

    const ring = el("svg:svg", { class: "ring", viewBox: "0 0 120 120", role: "img" });
    const title = el("svg:title");
    ring.append(title);
    ring.append(el("svg:circle", { class: "track", cx: 60, cy: 60, r: RING_R }));
    const progress = el("svg:circle", {
      class: "progress", cx: 60, cy: 60, r: RING_R,
      "stroke-dasharray": RING_C.toFixed(2), "stroke-dashoffset": "0",
    });
    ring.append(progress);
    const secs = el("svg:text", { class: "secs countdown", x: 60, y: 64 });
    const what = el("svg:text", { class: "what", x: 60, y: 80 });
    ring.append(secs, what);
    const empty = el("p", { class: "empty-note" });
    const ringBox = el("div");
    ringBox.append(ring, empty);

    const axis = el("svg:svg", { class: "axis", viewBox: "0 0 600 70",
      role: "img", "aria-label": `entries of ${l.name} on a ${fmtWindow(l.window_ms)} time axis` });
    const dots = el("svg:g");
    axis.append(el("svg:line", { class: "base", x1: 0, y1: 40, x2: 600, y2: 40 }));
    for (let i = 0; i <= 4; i++) {
      const x = i * 150;
      axis.append(el("svg:line", { class: "tick", x1: x, y1: 10, x2: x, y2: 44 }));
      const label = i === 4 ? "now" : `−${fmtSpan(l.window_ms * (4 - i) / 4)}`;
      const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
      axis.append(el("svg:text", { class: "label", x, y: 60, "text-anchor": anchor }, label));
    }
    axis.append(dots);
    card.append(ringBox, axis);
    box.append(card);
    cards.push({ ring, title, progress, secs, what, empty, dots, remaining });
  }
}

function animate() {
  if (view) {
    const elapsed = performance.now() - viewAt;
    const storeNow = view.now_ms + elapsed;
    $("#store-clock").textContent = new Date(storeNow).toISOString().replace("T", " ").replace("Z", " UTC");
    $("#store-clock").setAttribute("datetime", new Date(storeNow).toISOString());
    view.limits.forEach((l, i) => {
      const c = cards[i];
      if (!c) return;
      if (l.error) {
        // A limit with a key of its own that this client text names no bucket under.
        c.remaining.textContent = l.error;
        c.ring.style.display = "none";
        c.dots.replaceChildren();
        c.empty.textContent = "";
        return;
      }
      const full = l.remaining === 0;
      const debt = l.debt > 0 ? ` · ${l.debt} in debt` : "";
      const held = l.concurrent ? "held now" : "in window";
      // The kind in words (a calendar quota: its period and when it ends), from the server.
      const about = l.about ? ` · ${l.about}` : "";
      c.remaining.textContent = `${l.remaining} of ${l.requests} left · ${l.count} ${held}${debt}${about}`;
      c.remaining.classList.toggle("full", full);
      const hasEntries = l.count > 0;
      c.ring.style.display = hasEntries ? "" : "none";
      c.empty.textContent = hasEntries ? "" : "no entries in the window";
      const left = Math.max(0, l.reset_ms - elapsed);
      c.secs.textContent = fmtSecs(left);
      c.secs.setAttribute("data-ms", left.toFixed(0));
      c.what.textContent = full ? "room frees" : "oldest leaves";
      c.ring.classList.toggle("full", full);
      c.ring.setAttribute("aria-label",
        `${l.name}: ${full ? "room frees" : "oldest entry leaves"} in ${fmtSecs(left)}`);
      c.title.textContent = c.ring.getAttribute("aria-label");
      c.progress.setAttribute("stroke-dashoffset", (RING_C * (1 - left / l.window_ms)).toFixed(2));
      // Entries slide left as the store clock advances; the pivot (the entry whose exit frees
      // room) is drawn in red. It is appended last, so that entries of the same
      // millisecond (drawn at the same x) cannot cover it: SVG paints in document order.
      c.dots.replaceChildren();
      const pivot = Math.max(0, l.entries_ms.length - l.requests);
      let pivotRect = null;
      l.entries_ms.forEach((t, j) => {
        const x = ((t - (storeNow - l.window_ms)) / l.window_ms) * 600;
        if (x < 0 || x > 600) return;
        const isPivot = full && j === pivot;
        const rect = el("svg:rect", { class: "entry" + (isPivot ? " pivot" : ""),
          x: (x - 1.5).toFixed(1), y: 18, width: 3, height: 22, "data-ms": t });
        if (isPivot) pivotRect = rect;
        else c.dots.append(rect);
      });
      if (pivotRect) c.dots.append(pivotRect);
    });
  }
  requestAnimationFrame(animate);
}

async function pollWindow() {
  if (!selected) return;
  const q = `route=${encodeURIComponent(selected.route)}&client=${encodeURIComponent(selected.client)}`;
  try {
    const v = await api("GET", `/api/v1/window?${q}`);
    const reshape = !view || view.route !== v.route || view.limits.length !== v.limits.length;
    view = v;
    viewAt = performance.now();
    if (reshape) buildCards();
    $("#reset").disabled = false;
    if ($("#status").classList.contains("error")) status("");
  } catch (e) {
    view = null;
    buildCards();
    $("#reset").disabled = true;
    status(`window: ${e.message}`, true);
  }
}

function select(route, client, push) {
  selected = { route, client };
  view = null;
  if (push) {
    const url = `?route=${encodeURIComponent(route)}&client=${encodeURIComponent(client)}`;
    history.replaceState(null, "", url);
  }
  status(`inspecting route ${route}${client ? ` for ${client}` : ""}`);
  pollWindow();
}

async function resetBucket() {
  if (!selected) return;
  const q = `route=${encodeURIComponent(selected.route)}&client=${encodeURIComponent(selected.client)}`;
  try {
    await api("POST", `/api/v1/reset?${q}`);
    status(`bucket reset at ${new Date().toLocaleTimeString()}`);
    await pollWindow();
  } catch (e) {
    status(`reset: ${e.message}`, true);
  }
}

async function main() {
  $("#bucket-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    select($("#route").value, formClient(), true);
  });
  $("#route").addEventListener("change", updateHint);
  $("#reset").addEventListener("click", resetBucket);
  await pollRoutes();
  const params = new URLSearchParams(location.search);
  if (params.get("route")) {
    $("#route").value = params.get("route");
    updateHint();
    fillClient(params.get("client") || "");
    select(params.get("route"), params.get("client") || "", false);
  }
  pollTop();
  setInterval(pollRoutes, ROUTES_EVERY_MS);
  setInterval(pollTop, TOP_EVERY_MS);
  setInterval(pollWindow, WINDOW_EVERY_MS);
  requestAnimationFrame(animate);
}

main();
