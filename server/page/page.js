// The page of dormant-server: send a message, watch the run live, answer client tools and
// approvals. Plain JavaScript, no build step. What it remembers (the session, its token, the
// messages sent) is in localStorage, so a reload or a server restart picks the conversation
// up again.
"use strict";

const AGENT = document.querySelector('meta[name="dormant-agent"]').content;
const STORE_KEY = "dormant-page";
const $ = (selector) => document.querySelector(selector);

let saved = load();
let source = null; // the EventSource
let retryMs = 500; // backoff of our own reconnects
let lastSeq = -1; // the last chunk shown
let resuming = false;

function load() {
  try {
    return JSON.parse(localStorage.getItem(STORE_KEY)) || {};
  } catch (_) {
    return {};
  }
}

function save() {
  localStorage.setItem(STORE_KEY, JSON.stringify(saved));
}

function status(text) {
  $("#status").textContent = text;
}

function headers(json) {
  const out = {};
  if (json) out["Content-Type"] = "application/json";
  if (saved.token) out["Authorization"] = "Bearer " + saved.token;
  return out;
}

// A JSON request; answers { ok, status, body }.
async function call(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let parsed = null;
  try {
    parsed = await response.json();
  } catch (_) {
    parsed = { code: "unreadable", message: "the server's answer was not JSON" };
  }
  return { ok: response.ok, status: response.status, body: parsed };
}

// ---- the log ---------------------------------------------------------------------------

function entry(kind, text) {
  const item = document.createElement("li");
  item.className = kind;
  item.textContent = text;
  $("#log").appendChild(item);
  item.scrollIntoView({ block: "nearest" });
  return item;
}

function brief(value) {
  const text = JSON.stringify(value);
  return text.length > 300 ? text.slice(0, 300) + "…" : text;
}

function outcomeText(outcome) {
  if (outcome && "result" in outcome) return brief(outcome.result);
  if (outcome && "error" in outcome) return "error: " + outcome.error;
  return brief(outcome);
}

// Renders one chunk of the stream (a child's forwarded chunk is shown as its own, prefixed
// with the child's session).
function render(chunk, prefix) {
  const kind = chunk.kind;
  const who = prefix || "";
  switch (kind.type) {
    case "run_start": {
      const sent = (saved.sent || {})[chunk.seq];
      if (sent && !prefix) entry("user", "you: " + sent);
      break;
    }
    case "text":
      entry("text", who + kind.text);
      break;
    case "tool_start":
      entry("tool", who + "→ " + kind.tool_name + " " + brief(kind.input));
      break;
    case "tool_end":
      entry("tool", who + "← " + kind.tool_name + ": " + outcomeText(kind.outcome));
      break;
    case "tool_approval_request":
      entry("tool", who + "? " + kind.tool_name + " waits for your approval");
      break;
    case "tool_approval_response":
      entry("tool", who + (kind.approved ? "✓ approved " : "✗ denied ") + kind.tool_name +
        (kind.reason ? " (" + kind.reason + ")" : ""));
      break;
    case "forwarded":
      render(kind.chunk, who + "[" + kind.session_id + "] ");
      break;
    case "subagent_start":
      entry("tool", who + "sub-agent " + kind.session_id + " started");
      break;
    case "subagent_end":
      entry("tool", who + "sub-agent " + kind.session_id + " ended");
      break;
    case "run_suspended":
      if (!prefix) entry("end", "waiting for you");
      break;
    case "run_interrupted":
      entry("end", who + "interrupted" + (kind.error ? ": " + kind.error.message : ""));
      break;
    case "run_end": {
      const failed = kind.error ? ": " + kind.error.message : "";
      entry(kind.status === "completed" ? "end" : "end error", who + "run " + kind.status + failed);
      break;
    }
    default:
      entry("tool", who + kind.type);
  }
}

// ---- the stream --------------------------------------------------------------------------

// Event names are chunk types (a forwarded chunk is named as what it reports).
const CHUNK_TYPES = [
  "run_start", "text", "tool_start", "tool_end", "tool_approval_request",
  "tool_approval_response", "subagent_start", "subagent_end", "run_suspended",
  "run_interrupted", "run_end",
];

// Settles the calls shown as waiting: these chunks mean one appeared or went.
const CHANGES_PENDING = new Set([
  "run_suspended", "run_end", "run_interrupted", "tool_approval_request",
  "tool_approval_response", "tool_end", "forwarded",
]);

function connect(from) {
  if (source) source.close();
  const query = new URLSearchParams({
    session_id: saved.id, token: saved.token, until: "closed", from: String(from),
  });
  source = new EventSource("/sse?" + query);
  source.onopen = () => {
    retryMs = 500;
    status("connected");
    refreshPending();
  };
  for (const type of CHUNK_TYPES) source.addEventListener(type, onChunk);
  source.addEventListener("end", (event) => {
    // The server ended the stream (shutting down, or idle): come back from where we are.
    const reason = JSON.parse(event.data).reason;
    status("stream ended (" + reason + "), reconnecting…");
    reconnectLater();
  });
  source.addEventListener("error", (event) => {
    // An `error` event with data is the server's; without, the connection dropped, and the
    // browser retries by itself with Last-Event-ID unless it gave up (a refused reconnect).
    if (event.data) entry("error", "stream: " + JSON.parse(event.data).message);
    if (source && source.readyState === EventSource.CLOSED) reconnectLater();
    else status("reconnecting…");
  });
}

function reconnectLater() {
  if (source) source.close();
  source = null;
  const wait = retryMs;
  retryMs = Math.min(retryMs * 2, 5000);
  setTimeout(() => {
    if (saved.id && !source) connect(lastSeq + 1);
  }, wait);
}

function onChunk(event) {
  const chunk = JSON.parse(event.data);
  if (chunk.seq <= lastSeq) return; // already shown
  lastSeq = chunk.seq;
  render(chunk);
  const type = chunk.kind.type;
  if (CHANGES_PENDING.has(type)) refreshPending();
  if (type === "run_start") status("running");
  if (type === "run_end") status("run " + chunk.kind.status);
}

// ---- what waits for the person ------------------------------------------------------------

async function refreshPending() {
  if (!saved.id) return null;
  const answer = await call("GET", "/status?session_id=" + encodeURIComponent(saved.id));
  if (!answer.ok) {
    status("status: " + answer.body.message);
    return null;
  }
  const box = $("#pending");
  const shown = new Set();
  for (const call of answer.body.pending) {
    if (!call.waiting) continue;
    shown.add(call.tool_call_id);
    if (!box.querySelector('[data-tool-call-id="' + CSS.escape(call.tool_call_id) + '"]')) {
      box.appendChild(call.kind === "approval" ? approvalCard(call) : clientCard(call));
    }
  }
  for (const card of box.querySelectorAll(".card")) {
    if (!shown.has(card.dataset.toolCallId) && !card.dataset.keep) card.remove();
  }
  if (answer.body.status.startsWith("suspended")) status("waiting for you");
  return answer.body;
}

function card(call, title) {
  const box = document.createElement("form");
  box.className = "card";
  box.dataset.toolCallId = call.tool_call_id;
  box.dataset.kind = call.kind;
  box.dataset.tool = call.tool_name;
  const heading = document.createElement("h2");
  heading.textContent = title;
  box.appendChild(heading);
  return box;
}

function button(text, action, primary) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = text;
  element.dataset.action = action;
  if (primary) element.className = "primary";
  return element;
}

function note(box, text) {
  let line = box.querySelector(".note");
  if (!line) {
    line = document.createElement("p");
    line.className = "note";
    box.appendChild(line);
  }
  line.textContent = text;
}

// A client tool: the demo's ask_user is a question with a text field; any other tool gets a
// JSON result to fill in.
function clientCard(call) {
  const box = card(call, "The agent asks: " + call.tool_name);
  let read;
  if (call.tool_name === "ask_user" && typeof call.input.question === "string") {
    const question = document.createElement("p");
    question.textContent = call.input.question;
    const field = document.createElement("input");
    field.type = "text";
    field.name = "answer";
    field.setAttribute("aria-label", "Your answer");
    box.append(question, field);
    read = () => ({ answer: field.value });
  } else {
    const input = document.createElement("pre");
    input.textContent = JSON.stringify(call.input, null, 2);
    const field = document.createElement("textarea");
    field.name = "result";
    field.value = "{}";
    field.setAttribute("aria-label", "Result (JSON)");
    box.append(input, field);
    read = () => JSON.parse(field.value);
  }
  const send = button("Submit", "submit", true);
  const decline = button("Decline", "decline");
  send.addEventListener("click", () => {
    let result;
    try {
      result = read();
    } catch (error) {
      note(box, "not JSON: " + error.message);
      return;
    }
    answer(box, { session_id: saved.id, tool_call_id: call.tool_call_id, result });
  });
  decline.addEventListener("click", () =>
    answer(box, { session_id: saved.id, tool_call_id: call.tool_call_id, error: "declined by the user" }));
  box.addEventListener("submit", (event) => {
    event.preventDefault();
    send.click();
  });
  box.append(send, " ", decline);
  return box;
}

// An approval gate: the tool and its input, approve or deny with a reason.
function approvalCard(call) {
  const box = card(call, "Approve " + call.tool_name + "?");
  const input = document.createElement("pre");
  input.textContent = JSON.stringify(call.input, null, 2);
  const reason = document.createElement("input");
  reason.type = "text";
  reason.name = "reason";
  reason.placeholder = "reason (optional)";
  reason.setAttribute("aria-label", "Reason");
  const decide = (approved) => {
    const envelope = {
      kind: "approval-response", session_id: saved.id, tool_call_id: call.tool_call_id,
      approval_id: call.approval_id, approved,
    };
    if (reason.value) envelope.reason = reason.value;
    answer(box, envelope);
  };
  const approve = button("Approve", "approve", true);
  const deny = button("Deny", "deny");
  approve.addEventListener("click", () => decide(true));
  deny.addEventListener("click", () => decide(false));
  box.addEventListener("submit", (event) => event.preventDefault());
  box.append(input, reason, " ", approve, " ", deny);
  return box;
}

async function answer(box, envelope) {
  for (const element of box.querySelectorAll("button")) element.disabled = true;
  const reply = await call("POST", "/submit-tool-result", envelope);
  if (reply.ok) {
    note(box, "sent");
  } else if (reply.body.code === "already_completed") {
    // Another tab (or a retry) answered first; the first answer wins.
    note(box, "already answered (maybe in another tab)");
  } else {
    const details = (reply.body.errors || []).join("; ");
    note(box, reply.body.code + ": " + reply.body.message + (details ? " — " + details : ""));
    for (const element of box.querySelectorAll("button")) element.disabled = false;
    return;
  }
  box.classList.add("done");
  box.dataset.keep = "1"; // keep the note in view a moment after the run moves on
  setTimeout(() => box.remove(), 4000);
  await resumeIfNothingWaits();
}

// Resumes once every call has its answer (a resume with calls still waiting does nothing).
async function resumeIfNothingWaits() {
  if (resuming) return;
  resuming = true;
  try {
    const state = await refreshPending();
    if (!state || !state.status.startsWith("suspended")) return;
    if (state.pending.some((call) => call.waiting)) return;
    const reply = await call("POST", "/resume", { session_id: saved.id });
    if (!reply.ok && reply.body.code !== "already_running") {
      status("resume: " + reply.body.message);
    }
  } finally {
    resuming = false;
  }
}

// ---- sending ----------------------------------------------------------------------------

async function send(event) {
  event.preventDefault();
  const text = $("#message").value.trim();
  if (!text) return;
  const body = { agent: AGENT, message: text };
  if (saved.id) body.session_id = saved.id;
  $("#send").disabled = true;
  try {
    const reply = await call("POST", "/start", body);
    if (!reply.ok) {
      status(reply.body.code + ": " + reply.body.message);
      return;
    }
    $("#message").value = "";
    const fresh = saved.id !== reply.body.session_id;
    saved.id = reply.body.session_id;
    saved.token = reply.body.token || saved.token;
    saved.sent = Object.assign(fresh ? {} : saved.sent || {}, { [reply.body.from_seq]: text });
    save();
    showSession();
    if (fresh) {
      lastSeq = -1;
      $("#log").textContent = "";
      connect(0);
    } else if (!source) {
      connect(lastSeq + 1);
    }
  } finally {
    $("#send").disabled = false;
  }
}

function showSession() {
  $("#session").textContent = saved.id ? "session " + saved.id : "no conversation yet";
}

function reset() {
  if (source) source.close();
  source = null;
  saved = {};
  save();
  lastSeq = -1;
  $("#log").textContent = "";
  $("#pending").textContent = "";
  showSession();
  status("");
}

$("#compose").addEventListener("submit", send);
$("#new").addEventListener("click", reset);
showSession();
// A reload rebuilds the log from the session's first chunk, then follows it live.
if (saved.id && saved.token) connect(0);
