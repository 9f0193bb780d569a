// The attention tab: tasks whose fires went dead, expired, were skipped or ran late
// (GET /v1/attention), by type and reason, each linked to its task page, and acknowledged
// with a note (POST /v1/tasks/{id}/acknowledge), which takes it off the list.
"use strict";

/** The cursor of the rows shown and the filters it was made with (edits to the filter
 * fields take effect at the next List, never mid-list through "More"). */
const attentionList = { cursor: null, filters: null, seq: 0 };

function attentionRow(item) {
  const note = el("input", { class: "ack-note", placeholder: "note", maxlength: "500" });
  const acknowledge = el("button", { class: "ack", onclick: () => act(async () => {
    const body = note.value.trim() ? { note: note.value } : {};
    await api("POST", taskPath(item.task_id, "/acknowledge"), null, body);
    await renderAttention();
  }) }, "Acknowledge");
  return el("tr", { "data-task": item.task_id, "data-reason": item.reason },
    el("td", {}, el("a", { href: "#", class: "task-link", onclick: (e) => { e.preventDefault(); openTask(item.task_id); } }, item.task_id)),
    el("td", {}, item.type), el("td", { class: `fate-${item.reason}` }, item.reason),
    el("td", {}, when(item.since_ms)), el("td", {}, when(item.due_ms)), el("td", {}, errorLine(item.error)),
    el("td", { class: "write" }, note, acknowledge));
}

/** The first page of the list (``more``: the next page, added below). */
async function renderAttention(more = false) {
  const status = document.getElementById("attention-status");
  const body = document.querySelector("#attention tbody");
  const seq = ++attentionList.seq;  // the latest request's answer is the one shown
  const filters = more && attentionList.filters ? attentionList.filters : {
    type: document.getElementById("att-type").value.trim(),
    reason: document.getElementById("att-reason").value,
  };
  const page = await optional("GET", "/v1/attention", {
    ...filters, limit: 100, cursor: more ? attentionList.cursor : null,
  });
  if (seq !== attentionList.seq) return;
  attentionList.filters = filters;
  if (page === null) {
    body.replaceChildren();
    status.textContent = "The attention list is not available on this node.";
    document.getElementById("attention-more").hidden = true;
    return;
  }
  const rows = page.items.map(attentionRow);
  if (more) body.append(...rows); else body.replaceChildren(...rows);
  attentionList.cursor = page.cursor;
  document.getElementById("attention-more").hidden = !page.cursor;
  const shown = body.children.length;
  status.textContent = shown ? `${shown} task${shown === 1 ? "" : "s"} need${shown === 1 ? "s" : ""} attention${page.cursor ? " (more below)" : ""}.`
    : "Nothing needs attention.";
}

renderers.attention = () => renderAttention();
document.getElementById("attention-filter").addEventListener("submit", (e) => {
  e.preventDefault();
  act(() => renderAttention());
});
document.getElementById("attention-more").addEventListener("click", () => act(() => renderAttention(true)));
