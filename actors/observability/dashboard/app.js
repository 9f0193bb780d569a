// The dashboard's frame: signing in (whoami says whether the key may write: a read-only
// key's page hides every write control, class "write"), the tabs, and the refresh of the
// live views. Loaded last: the views (ops.js, task.js, tasks.js, attention.js) have
// registered their renderers by then.
"use strict";

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
// Never a secret in storage: clear the item that used to hold one.
sessionStorage.removeItem("metronome-key");
const rememberedKeyId = sessionStorage.getItem(KEY_ID_ITEM);
if (rememberedKeyId) {
  document.getElementById("key-id").value = rememberedKeyId;
  document.getElementById("secret").focus();
}
