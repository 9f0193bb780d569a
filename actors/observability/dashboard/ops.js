// The operations views: queues (with fires/s and start lag from /metrics), dead letters,
// nodes and partitions.
"use strict";

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
    const done = ["ok", "retried", "dead", "cancelled"].reduce((sum, o) => sum +
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
  const status = document.getElementById("dlq-status");
  if (!type) { body.replaceChildren(); status.textContent = ""; return; }
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
  // The newest 200 are shown: say so when there are more (replay all and purge all take
  // them all; the CLI and the API page through the rest).
  status.textContent = page.next_cursor
    ? `The newest ${page.dead_letters.length} shown; more are older (metronome dlq ls ${type} --before ${page.next_cursor}).`
    : "";
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

Object.assign(renderers, { queues: renderQueues, dlq: renderDlq, nodes: renderNodes });

document.getElementById("dlq-type").addEventListener("change", () => act(renderDlq));
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
