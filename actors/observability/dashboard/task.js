// The task page: one task's definition, status and note, its next fires, the explain
// sentences, its history, and the operator's actions on it (trigger, pause and resume with
// a note, stop, backfill after a dry run). Each action reloads the page from the API, so
// what it shows afterwards is what the API reports, not what the page assumed.
"use strict";

const taskPage = { taskId: null, backfill: null, seq: 0 };

const taskPath = (taskId, tail = "") => `/v1/tasks/${encodeURIComponent(taskId)}${tail}`;

// A task's note: who paused or resumed it, when and why (docs/API.md), or the automatic
// pause after a streak of dead fires. Text nodes only: a note is the operator's input.
function noteText(note) {
  if (note.unreadable !== undefined) return `a note is stored but cannot be read: ${note.unreadable}`;
  const head = note.reason === "failures"
    ? `paused after ${note.failures} dead fires in a row`
    : `${note.action === "resume" ? "resumed" : "paused"}${note.by ? ` by key ${note.by}` : ""}`;
  return `${head} at ${when(note.at_ms)}: ${note.note}`;
}

function scheduleText(schedule) {
  return Object.entries(schedule).filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
}

function renderFacts(task, facts) {
  const lastFate = task.last_fate || task.last_status;
  const rows = [
    ["Status", task.status],
    ["Schedule", `${facts ? `${facts.schedule_text} ` : ""}(${scheduleText(task.schedule)})`],
    ["Labels", labelText(task.labels) || "none"],
    ["Next fire", when(task.next_run_ms)],
    ["Last fate", lastFate ? `${lastFate} at ${when(task.last_run_ms)}${task.last_error ? `: ${errorLine(task.last_error)}` : ""}` : "never ran"],
    ["Counts", `${task.fires} fires, ${task.runs} runs, ${task.retries} retries`],
  ];
  document.getElementById("task-facts").replaceChildren(...rows.flatMap(([k, v]) => [
    el("dt", {}, k), el("dd", { "data-fact": k.toLowerCase().replace(" ", "-") }, v)]));
  document.getElementById("task-note-box").replaceChildren(
    ...(task.note ? [el("p", { id: "task-note", class: "note" }, `Note: ${noteText(task.note)}`)] : []));
}

function renderUpcoming(upcoming) {
  const rows = upcoming.fires.map((f) => [when(f.due_ms), when(f.fire_ms), f.local, f.note || ""]);
  document.getElementById("task-upcoming").replaceChildren(
    ...(rows.length ? [table("upcoming-fires", ["Due (grid time)", "Enqueued at", `Local (${upcoming.tz || "UTC"})`, "Note"], rows)] : []),
    ...upcoming.notes.map((n) => el("p", { class: "hint upcoming-note" }, n)));
}

function renderExplain(facts) {
  const runs = [
    ...facts.stream.map((m) => [m.schedule_id, m.attempt, m.delivered ? `running on ${m.consumer}` : "queued",
      when(m.enqueued_ms), m.delivered ? `idle ${seconds(m.idle_ms)}, delivered ${m.deliveries}x` : ""]),
    ...facts.retries.map((r) => [r.schedule_id, r.attempt, "waiting to retry", when(r.retry_at_ms),
      errorLine(r.last_error)]),
  ];
  const dead = facts.dead_letters.newest;
  if (dead) runs.push([dead.schedule_id, dead.attempt, `dead letter (${facts.dead_letters.count})`,
    when(Number(String(dead.entry_id).split("-")[0])), `${dead.reason}: ${errorLine(dead.error)}`]);
  if (facts.last_run_ms) runs.push(["last run", "", facts.last_status, when(facts.last_run_ms), facts.last_error || ""]);
  document.getElementById("task-explain").replaceChildren(
    el("ul", { id: "explain" }, ...facts.summary.map((line) => el("li", {}, line))),
    el("p", { class: "hint" }, `${facts.fires} fires, ${facts.runs} runs; next run ${when(facts.next_run_ms)}`),
    runs.length ? table("task-runs", ["Fire", "Attempt", "State", "When", "Detail"], runs)
      : el("p", { class: "hint" }, "Nothing queued, running, retrying or dead."));
}

function renderHistory(answer) {
  const box = document.getElementById("task-history");
  if (answer === null) {
    box.replaceChildren(el("p", { id: "history-missing", class: "hint" }, "History: not available on this node."));
    return;
  }
  if (!answer.history.length) {
    box.replaceChildren(el("p", { class: "hint" }, "No fires recorded yet."));
    return;
  }
  box.replaceChildren(el("table", { id: "history-table" },
    el("thead", {}, el("tr", {}, ...["Due", "Fate", "Origin", "Started", "Finished", "Node",
      "Attempt", "Error"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...answer.history.map((h) => el("tr", { "data-fate": h.fate, "data-origin": h.origin },
      el("td", {}, when(h.due_ms)), el("td", { class: `fate-${h.fate}` }, h.reason ? `${h.fate} (${h.reason})` : h.fate),
      el("td", {}, h.origin), el("td", {}, when(h.started_ms)), el("td", {}, when(h.finished_ms)),
      el("td", {}, h.node ?? "-"), el("td", { class: "num" }, h.attempt), el("td", {}, errorLine(h.error)))))));
}

/** Show the task page of ``taskId`` (a 404 is shown as the error, the page stays as it was). */
async function loadTask(taskId) {
  const seq = ++taskPage.seq;  // the task asked for last is shown, whichever answers first
  const task = await api("GET", taskPath(taskId));
  const [upcoming, facts, history] = await Promise.all([
    api("GET", taskPath(taskId, "/upcoming"), { n: 5 }),
    api("GET", taskPath(taskId, "/explain")),
    optional("GET", taskPath(taskId, "/history"), { limit: 20 }),
  ]);
  if (seq !== taskPage.seq) return;
  if (taskPage.taskId !== task.task_id) {
    taskPage.taskId = task.task_id;
    document.getElementById("action-result").hidden = true;
    document.getElementById("action-note").value = "";
    resetBackfill(true);
  }
  document.getElementById("task-title").textContent = `${task.task_id} (${task.type}): ${task.status}`;
  renderFacts(task, facts);
  renderUpcoming(upcoming);
  renderExplain(facts);
  renderHistory(history);
  document.getElementById("task").hidden = false;
}

/** Open a task's page from anywhere (the task list, the attention list). */
function openTask(taskId) {
  if (state.view !== "tasks") show("tasks");
  document.getElementById("task-id").value = taskId;
  act(async () => {
    await loadTask(taskId);
    document.getElementById("task").scrollIntoView({ block: "start" });
  });
}

function actionResult(text) {
  const box = document.getElementById("action-result");
  box.textContent = text;
  box.hidden = false;
}

/** Run one action on the shown task, say what the API answered, and reload the page
 * and the list from the API. */
function taskAction(fn) {
  return () => act(async () => {
    const taskId = taskPage.taskId;
    const text = await fn(taskId);
    if (text === null) return;  // the operator cancelled
    actionResult(text);
    await loadTask(taskId);
    if (typeof refreshList === "function") await refreshList();
  });
}

function noteBody() {
  const note = document.getElementById("action-note").value;
  return note.trim() ? { note } : undefined;
}

document.getElementById("act-trigger").addEventListener("click", taskAction(async (taskId) => {
  const done = await api("POST", taskPath(taskId, "/trigger"));
  return done.queued ? `Triggered: fire ${done.schedule_id} queued.`
    : `Triggered: fire ${done.schedule_id} held back by the overlap policy.`;
}));
for (const action of ["pause", "resume"]) {
  document.getElementById(`act-${action}`).addEventListener("click", taskAction(async (taskId) => {
    const done = await api("POST", taskPath(taskId, `/${action}`), null, noteBody());
    return `${action === "pause" ? "Paused" : "Resumed"}: the task is ${done.status}.`;
  }));
}
document.getElementById("act-stop").addEventListener("click", taskAction(async (taskId) => {
  if (!confirm(`Stop ${taskId}? A stopped task never fires again.`)) return null;
  const done = await api("POST", taskPath(taskId, "/stop"));
  return `Stopped: the task is ${done.status}.`;
}));

// -- backfill: a dry run says how many fires it would append; only then can it be applied

function resetBackfill(newTask) {
  taskPage.backfill = null;
  const apply = document.getElementById("backfill-apply");
  apply.hidden = true;
  if (!newTask) return;
  document.getElementById("backfill-preview").textContent = "";
  const end = Math.floor(Date.now() / 60000) * 60000;
  setUtcInput("backfill-end", end);
  setUtcInput("backfill-start", end - 3600000);
}

function backfillWindow() {
  const start = utcInput("backfill-start");
  const end = utcInput("backfill-end");
  if (Number.isNaN(start) || Number.isNaN(end)) throw new Error("backfill: give a start and an end as UTC ISO times, e.g. 2026-12-03T12:00:00Z");
  return { start_ms: start, end_ms: end };
}

document.getElementById("backfill-dry").addEventListener("click", () => act(async () => {
  resetBackfill(false);
  const taskId = taskPage.taskId;
  const span = backfillWindow();
  const plan = await api("POST", taskPath(taskId, "/backfill"), null, { ...span, dry_run: true });
  const appends = plan.fires.length - plan.already_backfilled;
  document.getElementById("backfill-preview").textContent =
    `Dry run: ${plan.fires.length} fires in the window, ${plan.already_backfilled} already ` +
    `backfilled; it would append ${appends}.`;
  if (appends > 0) {
    taskPage.backfill = { taskId, span, appends };
    const apply = document.getElementById("backfill-apply");
    apply.textContent = `Append ${appends} fires`;
    apply.hidden = false;
  }
}));
document.getElementById("backfill-apply").addEventListener("click", () => act(async () => {
  const plan = taskPage.backfill;
  if (!plan || plan.taskId !== taskPage.taskId) throw new Error("backfill: make a dry run first");
  resetBackfill(false);
  const done = await api("POST", taskPath(plan.taskId, "/backfill"), null, { ...plan.span, dry_run: false });
  document.getElementById("backfill-preview").textContent =
    `Backfilled: ${done.enqueued} fires appended, ${done.already_backfilled} already backfilled, ` +
    `${done.held_back} waiting behind the fire in flight, ` +
    `${done.skipped ?? 0} skipped by the overlap policy (not run).`;
  await loadTask(plan.taskId);
}));
for (const id of ["backfill-start", "backfill-end"]) {
  document.getElementById(id).addEventListener("input", () => resetBackfill(false));
}
document.getElementById("task-close").addEventListener("click", () => {
  document.getElementById("task").hidden = true;
  taskPage.taskId = null;
});
document.getElementById("task-search").addEventListener("submit", (e) => {
  e.preventDefault();
  act(() => loadTask(document.getElementById("task-id").value.trim()));
});
