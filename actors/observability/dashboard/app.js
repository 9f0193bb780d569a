// The Metronome dashboard: plain JavaScript, no build step. Every /v1 request is signed
// here exactly as docs/API.md says (WebCrypto HMAC-SHA256 over the canonical string, a
// fresh nonce each); a failed action shows the API's problem details as they came.
//
// The secret is never kept: signing in turns it into a non-extractable WebCrypto key held
// in this page's memory alone (script can sign with it, nothing can read it back), so a
// reload asks for it again. Only the key id is remembered, in this tab's session storage.
// The node's Content-Security-Policy allows no inline script or style: everything the
// page does is in this file, wired with addEventListener.
"use strict";

const state = { keyId: null, hmacKey: null, readOnly: true, view: "queues", rates: {},
  history: {}, lastMetrics: null, timer: null };
const encoder = new TextEncoder();
const KEY_ID_ITEM = "metronome-key-id";

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");
}

function nonce() {
  const bytes = crypto.getRandomValues(new Uint8Array(18));
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_");
}

function signingKey(secret) {
  // extractable = false: the key can sign, and neither this script nor anything injected
  // into the page can export the secret from it.
  return crypto.subtle.importKey("raw", encoder.encode(secret),
    { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
}

async function sign(method, pathWithQuery, body) {
  const timestamp = String(Date.now());
  const once = nonce();
  const digest = hex(await crypto.subtle.digest("SHA-256", encoder.encode(body)));
  const canonical = [method, pathWithQuery, timestamp, once, digest].join("\n");
  const mac = hex(await crypto.subtle.sign("HMAC", state.hmacKey, encoder.encode(canonical)));
  return { "X-Metronome-Key": state.keyId, "X-Metronome-Timestamp": timestamp,
    "X-Metronome-Nonce": once, "X-Metronome-Signature": mac };
}

async function signedFetch(method, target, body) {
  const headers = await sign(method, target, body);
  if (body) headers["Content-Type"] = "application/json";
  return fetch(target, { method, headers, body: body || undefined });
}

class Problem extends Error {
  constructor(status, problem) {
    super(`${status} ${problem.code || "error"}: ${problem.detail || problem.title || ""}`);
    this.problem = problem;
  }
}

async function api(method, path, params, bodyObject) {
  const query = params ? new URLSearchParams(
    Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== "")
  ).toString() : "";
  const target = path + (query ? `?${query}` : "");
  const body = bodyObject === undefined ? "" : JSON.stringify(bodyObject);
  const response = await signedFetch(method, target, body);
  const text = await response.text();
  let data;
  try { data = JSON.parse(text); } catch { data = { detail: text }; }
  if (!response.ok) throw new Problem(response.status, data);
  return data;
}

function showError(error) {
  const box = document.getElementById("error");
  if (!error) { box.hidden = true; box.textContent = ""; return; }
  let text = error.message;
  if (error.problem && Array.isArray(error.problem.errors)) {
    for (const e of error.problem.errors) text += `\n  ${e.field || "body"}: ${e.message}`;
  }
  box.textContent = text;
  box.hidden = false;
}

async function act(fn) {
  try { await fn(); showError(null); } catch (error) { showError(error); }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v); else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? "-"));
  return node;
}

const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "-");
const seconds = (ms) => (ms === null || ms === undefined ? "-" : `${(ms / 1000).toFixed(1)}s`);

// -- metrics: fires/s and lag per type between two scrapes ------------------------------

function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^(metronome_[a-z_]+)\{([^}]*)\} ([0-9.e+-]+)$/);
    if (!m) continue;
    const labels = Object.fromEntries([...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    out[`${m[1]}|${labels.type || ""}|${labels.outcome || ""}|${labels.le || ""}`] = Number(m[3]);
  }
  return out;
}

async function refreshRates(types) {
  // Signed: a node may keep /metrics from unsigned clients ([metrics] allow, token_env).
  let text;
  try {
    const response = await signedFetch("GET", "/metrics", "");
    if (!response.ok) return;
    text = await response.text();
  } catch { return; }
  const now = { at: Date.now(), values: parseMetrics(text) };
  const before = state.lastMetrics;
  state.lastMetrics = now;
  if (!before) return;
  const dt = (now.at - before.at) / 1000;
  for (const type of types) {
    const done = ["ok", "retried", "dead"].reduce((sum, o) => sum +
      (now.values[`metronome_fires_finished_total|${type}|${o}|`] || 0) -
      (before.values[`metronome_fires_finished_total|${type}|${o}|`] || 0), 0);
    const rate = dt > 0 ? done / dt : 0;
    const lagBuckets = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5",
      "5.0", "10.0", "30.0", "60.0", "300.0", "+Inf"];
    const count = (le) => (now.values[`metronome_start_lag_seconds_bucket|${type}||${le}`] || 0) -
      (before.values[`metronome_start_lag_seconds_bucket|${type}||${le}`] || 0);
    const total = count("+Inf");
    const p50 = total ? lagBuckets.find((le) => count(le) >= total / 2) : null;
    state.rates[type] = { rate, p50 };
    const series = (state.history[type] = state.history[type] || []);
    series.push(rate);
    if (series.length > 60) series.shift();
  }
}

function sparkline(values) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 120 24");
  const max = Math.max(1, ...values);
  const step = 120 / Math.max(1, values.length - 1);
  const points = values.map((v, i) => `${i * step},${23 - (v / max) * 22}`).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.append(line);
  return svg;
}

// -- views --------------------------------------------------------------------------------

async function renderQueues() {
  const data = await api("GET", "/v1/queues");
  const types = data.queues.map((q) => q.type);
  await refreshRates(types);
  const body = document.querySelector("#queues tbody");
  body.replaceChildren(...data.queues.map((q) => {
    const rate = state.rates[q.type];
    const purge = el("button", { class: "danger", "data-type": q.type, onclick: () => act(async () => {
      if (!confirm(`Delete every undelivered message of ${q.type}? Their fires will not run.`)) return;
      await api("POST", `/v1/queues/${encodeURIComponent(q.type)}/purge`, null, { confirm: q.type });
      await renderQueues();
    }) }, "Purge backlog");
    return el("tr", { "data-type": q.type },
      el("td", {}, q.type), el("td", { class: "num backlog" }, q.undelivered),
      el("td", { class: "num" }, q.pending), el("td", { class: "num" }, seconds(q.oldest_pending_age_ms)),
      el("td", { class: "num" }, q.consumers.length), el("td", { class: "num" }, q.retrying),
      el("td", { class: "num" }, q.dead_letters),
      el("td", { class: "num" }, rate ? rate.rate.toFixed(1) : "-"),
      el("td", { class: "num" }, rate && rate.p50 ? `${rate.p50}s` : "-"),
      el("td", {}, sparkline(state.history[q.type] || [])),
      el("td", { class: "write" }, purge));
  }));
  const select = document.getElementById("dlq-type");
  const chosen = select.value;
  select.replaceChildren(...types.map((t) => el("option", { value: t }, t)));
  if (types.includes(chosen)) select.value = chosen;
  return data;
}

async function renderDlq() {
  const select = document.getElementById("dlq-type");
  if (!select.value) await renderQueues();
  const type = select.value;
  const body = document.querySelector("#dlq tbody");
  if (!type) { body.replaceChildren(); return; }
  const page = await api("GET", `/v1/dlq/${encodeURIComponent(type)}`, { limit: 200 });
  body.replaceChildren(...page.dead_letters.map((d) => el("tr", { "data-entry": d.entry_id },
    el("td", {}, d.entry_id), el("td", {}, when(d.dead_ms)), el("td", {}, d.task_id),
    el("td", { class: "num" }, d.attempts), el("td", {}, d.reason), el("td", {}, d.error_line || d.error),
    el("td", {},
      el("button", { onclick: () => act(async () => {
        const entry = await api("GET", `/v1/dlq/${encodeURIComponent(type)}/${d.entry_id}`);
        const detail = document.getElementById("dlq-detail");
        detail.textContent = Object.entries(entry).map(([k, v]) => `${k}: ${v}`).join("\n");
        detail.hidden = false;
      }) }, "Show"),
      el("span", { class: "write" },
        el("button", { class: "replay", onclick: () => act(async () => {
          await api("POST", `/v1/dlq/${encodeURIComponent(type)}/replay`, null, { entry_ids: [d.entry_id] });
          await renderDlq();
        }) }, "Replay"),
        el("button", { class: "danger purge", onclick: () => act(async () => {
          await api("POST", `/v1/dlq/${encodeURIComponent(type)}/purge`, null, { entry_ids: [d.entry_id] });
          await renderDlq();
        }) }, "Purge"))))));
}

async function renderPartitions() {
  const view = await api("GET", "/v1/partitions");
  document.getElementById("pollers").textContent = `Live pollers: ${view.pollers.join(", ") || "none"}`;
  const lease = (p) => (p.lease_until_ms === null ? "free"
    : p.live ? `${seconds(p.lease_until_ms - view.now_ms)} left` : "expired");
  document.querySelector("#partitions tbody").replaceChildren(...view.partitions.map((p) =>
    el("tr", { "data-partition": p.partition },
      el("td", { class: "num" }, p.partition), el("td", {}, p.poller || "-"),
      el("td", { class: p.live ? "up" : "down" }, lease(p)),
      el("td", { class: "num" }, p.claims_in_flight), el("td", { class: "num" }, p.due_now),
      el("td", {}, when(p.next_due_ms)))));
}

async function renderNodes() {
  await renderPartitions();
  const data = await api("GET", "/v1/nodes");
  const box = document.getElementById("nodes");
  box.replaceChildren(...data.processes.map((p) => el("div", { class: "node", "data-process": p.process },
    el("h3", { class: p.alive ? "" : "gone" },
      `${p.process} (pid ${p.pid}) `, p.alive ? `seen ${seconds(p.age_ms)} ago` : `gone: silent for ${seconds(p.age_ms)}`),
    el("table", {}, el("tbody", {}, ...[
      ...p.up.map((path) => [path, "running"]),
      ...Object.entries(p.down).map(([path, why]) => [path, `down: ${why}`]),
    ].sort().map(([path, status]) => el("tr", {},
      el("td", {}, path), el("td", { class: status === "running" ? "up" : "down" }, status),
      el("td", { class: "num" }, `${p.restarts[path] || 0} restarts`))))))));
}

// A task's note: who paused or resumed it, when and why (docs/API.md), or the automatic
// pause after a streak of dead fires. Text nodes only: a note is the operator's input.
function noteText(note) {
  if (note.unreadable !== undefined) return `a note is stored but cannot be read: ${note.unreadable}`;
  const head = note.reason === "failures"
    ? `paused after ${note.failures} dead fires in a row`
    : `${note.action === "resume" ? "resumed" : "paused"}${note.by ? ` by key ${note.by}` : ""}`;
  return `${head} at ${when(note.at_ms)}: ${note.note}`;
}

async function explainTask(taskId) {
  const box = document.getElementById("task");
  const facts = await api("GET", `/v1/tasks/${encodeURIComponent(taskId)}/explain`);
  const table = (id, headers, rows) => el("table", { id },
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))))));
  const runs = [
    ...facts.stream.map((m) => [m.schedule_id, m.attempt, m.delivered ? `running on ${m.consumer}` : "queued",
      when(m.enqueued_ms), m.delivered ? `idle ${seconds(m.idle_ms)}, delivered ${m.deliveries}x` : ""]),
    ...facts.retries.map((r) => [r.schedule_id, r.attempt, "waiting to retry", when(r.retry_at_ms),
      (r.last_error || "").split("\n").filter(Boolean).pop() || ""]),
  ];
  const dead = facts.dead_letters.newest;
  if (dead) runs.push([dead.schedule_id, dead.attempt, `dead letter (${facts.dead_letters.count})`,
    when(Number(String(dead.entry_id).split("-")[0])), `${dead.reason}: ${(dead.error || "").split("\n").filter(Boolean).pop() || ""}`]);
  if (facts.last_run_ms) runs.push(["last run", "", facts.last_status, when(facts.last_run_ms), facts.last_error || ""]);
  box.replaceChildren(
    el("h3", {}, `${facts.task_id}: ${facts.status}, ${facts.schedule_text}`),
    ...(facts.note ? [el("p", { id: "task-note", class: "note" }, `Note: ${noteText(facts.note)}`)] : []),
    el("ul", { id: "explain" }, ...facts.summary.map((line) => el("li", {}, line))),
    el("p", { class: "hint" }, `${facts.fires} fires, ${facts.runs} runs; next run ${when(facts.next_run_ms)}`),
    table("task-runs", ["Fire", "Attempt", "State", "When", "Detail"], runs),
  );
}

async function listTasks() {
  const page = await api("GET", "/v1/tasks", {
    type: document.getElementById("list-type").value, status: document.getElementById("list-status").value,
    limit: 100,
  });
  document.querySelector("#tasks tbody").replaceChildren(...page.tasks.map((t) => el("tr", {},
    el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); act(() => explainTask(t.task_id)); } }, t.task_id)),
    el("td", {}, t.type), el("td", {}, t.status), el("td", {}, when(t.next_run_ms)),
    el("td", { class: "num" }, t.runs), el("td", {}, t.last_status))));
}

const renderers = { queues: renderQueues, dlq: renderDlq, nodes: renderNodes, tasks: async () => {} };

function show(view) {
  state.view = view;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== `view-${view}`;
  act(renderers[view]);
}

async function signIn(keyId, secret) {
  state.keyId = keyId;
  state.hmacKey = await signingKey(secret);
  let me;
  try { me = await api("GET", "/v1/whoami"); } catch (error) { state.hmacKey = null; throw error; }
  state.readOnly = me.read_only;
  sessionStorage.setItem(KEY_ID_ITEM, keyId);
  document.getElementById("secret").value = "";
  document.body.classList.toggle("read-only", me.read_only);
  document.getElementById("who").textContent = `${me.key_id}${me.read_only ? " (read-only)" : ""}`;
  document.getElementById("login").hidden = true;
  document.getElementById("tabs").hidden = false;
  document.getElementById("views").hidden = false;
  show(state.view);
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (state.view === "queues" || state.view === "nodes") act(renderers[state.view]); }, 2000);
}

document.getElementById("login").addEventListener("submit", (e) => {
  e.preventDefault();
  const secret = document.getElementById("secret");
  act(() => signIn(document.getElementById("key-id").value, secret.value));
});
for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.view));
document.getElementById("dlq-type").addEventListener("change", () => act(renderDlq));
document.getElementById("task-search").addEventListener("submit", (e) => {
  e.preventDefault();
  act(() => explainTask(document.getElementById("task-id").value.trim()));
});
document.getElementById("task-list").addEventListener("submit", (e) => { e.preventDefault(); act(listTasks); });
document.getElementById("dlq-replay-all").addEventListener("click", () => act(async () => {
  const type = document.getElementById("dlq-type").value;
  await api("POST", `/v1/dlq/${encodeURIComponent(type)}/replay`, null, { all: true });
  await renderDlq();
}));
document.getElementById("dlq-purge-all").addEventListener("click", () => act(async () => {
  const type = document.getElementById("dlq-type").value;
  if (!confirm(`Delete every dead letter of ${type}?`)) return;
  await api("POST", `/v1/dlq/${encodeURIComponent(type)}/purge`, null, { all: true, confirm: type });
  await renderDlq();
}));
// Never a secret in storage: clear the item that used to hold one.
sessionStorage.removeItem("metronome-key");
const rememberedKeyId = sessionStorage.getItem(KEY_ID_ITEM);
if (rememberedKeyId) {
  document.getElementById("key-id").value = rememberedKeyId;
  document.getElementById("secret").focus();
}
