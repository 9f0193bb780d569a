// The Metronome dashboard: plain JavaScript, no build step, a few classic scripts loaded in
// order by index.html (this one first: signing, requests, errors, formatting; then one file
// per view; app.js last wires them up). Every /v1 request is signed here exactly as
// docs/API.md says (WebCrypto HMAC-SHA256 over the canonical string, a fresh nonce each); a
// failed action shows the API's problem details as they came, never nothing.
//
// The secret is never kept: signing in turns it into a non-extractable WebCrypto key held
// in this page's memory alone (script can sign with it, nothing can read it back), so a
// reload asks for it again. Only the key id is remembered, in this tab's session storage.
// The node's Content-Security-Policy allows no inline script or style: everything the
// page does is in these files, wired with addEventListener.
"use strict";

const state = { keyId: null, hmacKey: null, readOnly: true, view: "queues", rates: {},
  history: {}, lastMetrics: null, timer: null };
const encoder = new TextEncoder();
const KEY_ID_ITEM = "metronome-key-id";
/** Each view's render function, by the name its tab button carries (data-view). */
const renderers = {};

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
    this.status = status;
    this.problem = problem;
  }
}

/** The query string of ``params``: empty values left out, an array repeats its name
 * (``label=a=1&label=b=2``, as the task list takes labels). */
function queryString(params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (v !== null && v !== undefined && v !== "") query.append(name, v);
    }
  }
  return query.toString();
}

async function api(method, path, params, bodyObject) {
  const query = queryString(params);
  const target = path + (query ? `?${query}` : "");
  const body = bodyObject === undefined ? "" : JSON.stringify(bodyObject);
  const response = await signedFetch(method, target, body);
  const text = await response.text();
  let data;
  try { data = JSON.parse(text); } catch { data = { detail: text }; }
  if (!response.ok) throw new Problem(response.status, data);
  return data;
}

/** ``api`` for an endpoint this node may not have (an older release): null on a 404,
 * so the caller shows "not available" instead of failing the whole view. */
async function optional(method, path, params, bodyObject) {
  try {
    return await api(method, path, params, bodyObject);
  } catch (error) {
    if (error instanceof Problem && error.status === 404) return null;
    throw error;
  }
}

function problemText(error) {
  let text = error.message;
  if (error.problem && Array.isArray(error.problem.errors)) {
    for (const e of error.problem.errors) text += `\n  ${e.field || "body"}: ${e.message}`;
  }
  return text;
}

function showError(error) {
  const box = document.getElementById("error");
  if (!error) { box.hidden = true; box.textContent = ""; return; }
  box.textContent = problemText(error);
  box.hidden = false;
}

/** Run a view's load or an operator's action: a failure is shown (problem details), a
 * success clears a failure shown before it started (never a later action's: that one is
 * news the operator has not read yet). */
const acts = { started: 0, shown: 0 };
async function act(fn) {
  const seq = ++acts.started;
  try {
    await fn();
    if (acts.shown < seq) showError(null);
  } catch (error) {
    acts.shown = seq;
    showError(error);
  }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v); else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? "-"));
  return node;
}

function table(id, headers, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))))));
}

/** How far ``ms`` is from now, in words: "in 12 s", "3 min ago". */
function relative(ms) {
  const delta = ms - Date.now();
  const abs = Math.abs(delta) / 1000;
  if (abs < 1) return "now";
  const [n, unit] = abs < 60 ? [abs, "s"] : abs < 3600 ? [abs / 60, "min"]
    : abs < 86400 ? [abs / 3600, "h"] : [abs / 86400, "d"];
  const text = `${Math.floor(n)} ${unit}`;
  return delta > 0 ? `in ${text}` : `${text} ago`;
}

/** A moment as UTC ISO 8601 and relative to now: "2026-12-03T12:00:00Z (3 min ago)". */
const when = (ms) => (ms ? `${new Date(ms).toISOString().slice(0, 19)}Z (${relative(ms)})` : "-");
const seconds = (ms) => (ms === null || ms === undefined ? "-" : `${(ms / 1000).toFixed(1)}s`);
/** The line of an error that says what happened, as the API's ``error_line``: in a traceback,
 * the exception's line after its last frame (a message of several lines or a note puts
 * other lines last); in other text, its last non-empty line. */
const errorLine = (text) => {
  const lines = (text || "").split("\n").filter((line) => line.trim());
  const frame = lines.map((line) => line.startsWith("  File ")).lastIndexOf(true);
  if (frame < 0) return (lines.pop() ?? "").trim();
  const found = lines.findIndex((line, k) => k > frame && !line.startsWith(" "));
  const at = found < 0 ? lines.length - 1 : found;
  const line = lines[at].trim();
  return line.endsWith(":") && at + 1 < lines.length ? `${line} ${lines[at + 1].trim()}` : line;
};
const labelText = (labels) => Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");

/** A time input's value, UTC ISO 8601 ("2026-12-03T12:00:00Z"; without a zone it is read as
 * UTC too), in Unix ms; NaN when empty or not a time. */
function utcInput(id) {
  const value = document.getElementById(id).value.trim();
  if (!value) return NaN;
  return Date.parse(/(Z|[+-]\d\d:?\d\d)$/i.test(value) ? value : `${value}Z`);
}

/** Fill a time input with a UTC moment, as utcInput reads it. */
function setUtcInput(id, ms) {
  document.getElementById(id).value = `${new Date(ms).toISOString().slice(0, 19)}Z`;
}
