// The task list: GET /v1/tasks filtered by type, status, labels and last outcome, paged by
// the API's cursor, optionally narrowed to the tasks on the attention list; and "act on all
// matching": the list's filters as a selector for POST /v1/tasks/actions, a dry run first
// (how many match, a sample), then the same request applied.
"use strict";

const PAGE_SIZE = 50;
const PAGES_PER_VIEW = 20;
/** The filters the list shows, the cursor of the page shown and those before it. */
const listing = { filters: null, cursor: null, before: [], next: null, seq: 0 };
const bulk = { plan: null };

/** The list form's filters; labels are "key=value" words (several: all must match). */
function readFilters() {
  const value = (id) => document.getElementById(id).value.trim();
  const labels = value("list-labels").split(/[\s,]+/).filter(Boolean);
  for (const label of labels) {
    if (!/^[^=]+=/.test(label)) throw new Error(`labels: "${label}" is not key=value`);
  }
  return { type: value("list-type"), status: value("list-status"), labels,
    last_status: value("list-last"), last_fate: value("list-fate"),
    attention: value("list-attention") };
}

/** The ids on the attention list (of the filter's type and reason), or null where this
 * node has no attention list. Reads a bounded number of pages. */
async function attentionIds(filters) {
  const ids = new Set();
  let cursor = null;
  for (let pages = 0; pages < 20; pages++) {
    const page = await optional("GET", "/v1/attention", { type: filters.type, limit: 200, cursor,
      reason: filters.attention === "any" ? "" : filters.attention });
    if (page === null) return null;
    for (const item of page.items) ids.add(item.task_id);
    cursor = page.cursor;
    if (!cursor) break;
  }
  return ids;
}

function taskRow(t) {
  const fate = t.last_fate || t.last_status;
  return el("tr", { "data-task": t.task_id, "data-status": t.status },
    el("td", {}, el("a", { href: "#", class: "task-link", onclick: (e) => { e.preventDefault(); openTask(t.task_id); } }, t.task_id)),
    el("td", {}, t.type), el("td", { class: "status" }, t.status),
    el("td", { class: "labels" }, labelText(t.labels)), el("td", {}, when(t.next_run_ms)),
    el("td", { class: fate ? `fate-${fate}` : "" }, fate || "-"));
}

/** Show the page at ``cursor`` of the current filters. With the attention filter, pages are
 * read on until one has a match (or a bounded number were read): most tasks do not. */
async function loadPage(cursor) {
  const filters = listing.filters;
  const seq = ++listing.seq;  // a later listing wins, whichever answer comes first
  const line = document.getElementById("list-status-line");
  let only = null;
  if (filters.attention) {
    only = await attentionIds(filters);
    if (seq !== listing.seq) return;
    if (only === null) {
      document.querySelector("#tasks tbody").replaceChildren();
      line.textContent = "The attention list is not available on this node.";
      listing.next = null;
      return;
    }
  }
  const rows = [];
  const unreadable = [];  // tasks whose stored records the node cannot read: named, not rows
  let next = cursor;
  // A filter that keeps few tasks answers short, even empty pages (each request reads a
  // bounded number of tasks): read on until one has rows, up to PAGES_PER_VIEW requests.
  for (let pages = 0; pages < PAGES_PER_VIEW; pages++) {
    const page = await api("GET", "/v1/tasks", { type: filters.type, status: filters.status,
      label: filters.labels, last_status: filters.last_status, last_fate: filters.last_fate,
      cursor: next, limit: PAGE_SIZE });
    rows.push(...page.tasks.filter((t) => !only || only.has(t.task_id)));
    unreadable.push(...(page.unreadable || []).map((u) => u.task_id));
    next = page.next_cursor;
    if (!next || rows.length) break;
  }
  if (seq !== listing.seq) return;
  listing.cursor = cursor;
  listing.next = next;
  document.querySelector("#tasks tbody").replaceChildren(...rows.map(taskRow));
  line.textContent = `${rows.length} task${rows.length === 1 ? "" : "s"} on this page` +
    (next ? "; more on the next." : ".") +
    (unreadable.length ? ` Stored records that cannot be read: ${unreadable.join(", ")}.` : "");
  document.getElementById("list-next").hidden = !next;
  document.getElementById("list-prev").hidden = listing.before.length === 0;
}

/** List from the first page with the form's filters (a new selector: the last dry run no
 * longer describes it). */
async function listTasks() {
  listing.filters = readFilters();
  listing.before = [];
  resetBulk();
  await loadPage(null);
}

/** The page shown, read again (after an action changed what it shows). */
async function refreshList() {
  if (listing.filters) await loadPage(listing.cursor);
}

renderers.tasks = async () => (listing.filters ? refreshList() : listTasks());

document.getElementById("task-list").addEventListener("submit", (e) => { e.preventDefault(); act(listTasks); });
document.getElementById("list-next").addEventListener("click", () => act(async () => {
  listing.before.push(listing.cursor);
  await loadPage(listing.next);
}));
document.getElementById("list-prev").addEventListener("click", () => act(async () => {
  await loadPage(listing.before.pop() ?? null);
}));

// -- act on all matching -----------------------------------------------------------------

/** The selector of POST /v1/tasks/actions for the list's filters. */
function selectorOf(filters) {
  if (filters.attention) {
    throw new Error("the attention filter is not part of a selector: clear it to act on all matching");
  }
  const selector = {};
  for (const name of ["type", "status", "last_status", "last_fate"]) {
    if (filters[name]) selector[name] = filters[name];
  }
  if (filters.labels.length) {
    selector.labels = Object.fromEntries(filters.labels.map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
  }
  return selector;
}

function bulkBody() {
  const action = document.getElementById("bulk-action").value;
  const body = { selector: selectorOf(readFilters()), action };
  const note = document.getElementById("bulk-note").value;
  if (note.trim() && (action === "pause" || action === "resume")) body.note = note;
  if (action === "backfill") {
    body.start_ms = utcInput("bulk-start");
    body.end_ms = utcInput("bulk-end");
    if (Number.isNaN(body.start_ms) || Number.isNaN(body.end_ms)) throw new Error("backfill: give a start and an end as UTC ISO times, e.g. 2026-12-03T12:00:00Z");
  }
  return body;
}

function resetBulk() {
  bulk.plan = null;
  document.getElementById("bulk-apply").hidden = true;
  const backfill = document.getElementById("bulk-action").value === "backfill";
  document.getElementById("bulk-window").hidden = !backfill;
  if (backfill && !document.getElementById("bulk-end").value) {
    const end = Math.floor(Date.now() / 60000) * 60000;
    setUtcInput("bulk-end", end);
    setUtcInput("bulk-start", end - 3600000);
  }
}

document.getElementById("bulk-dry").addEventListener("click", () => act(async () => {
  resetBulk();
  const preview = document.getElementById("bulk-preview");
  const body = bulkBody();
  // The list shows what the selector matches: the form's filters, listed again.
  await listTasks();
  const answer = await optional("POST", "/v1/tasks/actions", null, { ...body, dry_run: true });
  if (answer === null) {
    preview.textContent = "Acting on all matching tasks is not available on this node.";
    return;
  }
  const sample = answer.sample.length ? `, e.g. ${answer.sample.join(", ")}` : "";
  preview.textContent = `Dry run: ${answer.count} task${answer.count === 1 ? "" : "s"} match${answer.count === 1 ? "es" : ""}${sample}.`;
  if (answer.count > 0) {
    // One id for the action: an apply sent again (a timeout, a second click) continues it
    // instead of starting another (a trigger would fire every task again).
    const id = `dash-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    bulk.plan = { ...body, action_id: id };
    const apply = document.getElementById("bulk-apply");
    apply.textContent = `Apply ${body.action} to ${answer.count} tasks`;
    apply.hidden = false;
  }
}));
document.getElementById("bulk-apply").addEventListener("click", () => act(async () => {
  const body = bulk.plan;
  if (!body) throw new Error("act on all matching: make a dry run first");
  // The plan (and its action id) stays until the API has answered it: an apply that fails
  // (a timeout, a node away) is clicked again with the same id, which sees the action
  // through instead of starting another.
  const apply = document.getElementById("bulk-apply");
  apply.disabled = true;
  let done;
  try {
    done = await api("POST", "/v1/tasks/actions", null, { ...body, dry_run: false });
  } finally {
    apply.disabled = false;
  }
  resetBulk();
  const first = done.failed.length < done.failed_count ? ` (the first ${done.failed.length})` : "";
  const failed = done.failed.length
    ? ` Failed${first}: ${done.failed.map((f) => (typeof f === "object" ? `${f.task_id}: ${f.reason || f.error || ""}` : f)).join("; ")}.`
    : "";
  document.getElementById("bulk-preview").textContent =
    `${body.action}: ${done.count} matched, ${done.changed} changed, ${done.unchanged} unchanged, ` +
    `${done.failed_count} failed.${failed}`;
  await refreshList();
}));
// A dry run's plan is for the action and the filters it was made with: editing any of
// them asks for a dry run again before Apply.
for (const id of ["bulk-action", "bulk-note", "bulk-start", "bulk-end", "list-type",
  "list-status", "list-labels", "list-last", "list-fate", "list-attention"]) {
  document.getElementById(id).addEventListener("input", resetBulk);
}
