// The page of dormant-server: send a message, watch the run live, answer client tools and
// approvals. Plain JavaScript, no build step (the server's CSP allows only this script).
// What it remembers is in localStorage ({session_id, token, lastSeq, sent: each message by the
// sequence number its run starts at, since: when the conversation began}), so a reload, a
// second tab or a server restart picks the same conversation up again.
"use strict";

const AGENT = document.querySelector('meta[name="dormant-agent"]').content;
// Every route sits beside this script, wherever the server is mounted (a daemon may nest its
// router under a prefix): paths are resolved against the script's own URL, never the root.
const BASE = new URL("./", document.currentScript.src);
// Pages mounted under different prefixes of one origin keep their conversations apart.
const STORE_KEY = BASE.pathname === "/" ? "dormant-page" : "dormant-page:" + BASE.pathname;
const $ = (selector) => document.querySelector(selector);

let saved = load();
let source = null; // the EventSource
let retryMs = 500; // the backoff of our own reconnects
let retryTimer = null;
let lastSeq = -1; // the last chunk shown
let turnSeq = -1; // the first chunk (run_start) of the last turn a message started
let rootCallOf = new Map(); // a sub-agent's session → the root's call it works for
let parentOf = new Map(); // a sub-agent's session → {parent session, the parent's call}
let abandonedAt = new Map(); // a root's call → the chunk that says a new message abandoned it
let typing = null; // the line of the reply a streaming model is writing, if any
let resuming = false; // a resume check is under way...
let resumeAgain = false; // ...and another answer came in meanwhile: check again after it
let refreshing = false; // a /status refresh is under way...
let refreshAgain = false; // ...and a chunk said things changed meanwhile
let refreshResume = false; // the next refresh also resumes a run whose calls are all answered
let statusAsked = 0; // /status requests sent...
let statusShown = 0; // ...and the latest one whose answer the cards show

// ---- what the page remembers ----------------------------------------------------------------

function load() {
  let text = null;
  try {
    text = localStorage.getItem(STORE_KEY);
  } catch (_) {
    text = null; // storage refused (a privacy setting): nothing remembered
  }
  return parse(text);
}

function parse(text) {
  let value = {};
  try {
    value = JSON.parse(text) || {};
  } catch (_) {
    value = {};
  }
  // The first version of the page kept the session's id as `id`.
  if (value.id && !value.session_id) value.session_id = value.id;
  delete value.id;
  return value;
}

// Writes what the page remembers. `followOnly`: only if the stored conversation is still
// this one (a chunk of an old conversation must not win over a new one another tab just
// started, before its storage event gets here).
function save(followOnly) {
  // Another tab of the same conversation may have sent a message since we last read: keep
  // its text too, so that either tab shows every message after a reload.
  const stored = load();
  const same = Boolean(saved.session_id) && stored.session_id === saved.session_id;
  if (followOnly && !same) return;
  if (same) saved.sent = Object.assign({}, stored.sent, saved.sent);
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(saved));
  } catch (_) {
    // Storage full or refused: the page still works, only a reload forgets the conversation.
  }
}

// Another tab wrote: pick up the messages it sent, or follow it to another conversation (a
// new one, or none after "New conversation"), as a reload would.
window.addEventListener("storage", (event) => {
  if (event.key !== STORE_KEY) return;
  // What that tab wrote, not what storage holds now: this tab may have written since (its
  // last chunk seen), over the other's message.
  const other = parse(event.newValue);
  if (other.session_id && other.session_id === saved.session_id) {
    saved.sent = Object.assign({}, saved.sent, other.sent);
    if (other.token) saved.token = other.token;
    fillSent();
    return;
  }
  // The newest conversation wins: a tab still writing the last chunk it saw of an older one
  // (storage reaches other tabs a moment late) must not pull this one back.
  if ((other.since || 0) > (saved.since || 0)) open(other);
});

// The text of the message that started the turn whose run_start is chunk `seq`, the previous
// turn's being chunk `after`. A message is kept by the first chunk of its turn (`from_seq`),
// which is its run_start, or before it the results of the calls it abandoned.
function sentBetween(after, seq) {
  let found = null;
  for (const [from, text] of Object.entries(saved.sent || {})) {
    if (Number(from) > after && Number(from) <= seq) found = text;
  }
  return found;
}

// Shows the messages whose text was not known when their run started.
function fillSent() {
  for (const line of $("#log").querySelectorAll("li.user[hidden]")) {
    const sent = sentBetween(Number(line.dataset.after), Number(line.dataset.seq));
    if (sent) {
      line.textContent = "you: " + sent;
      line.hidden = false;
    }
  }
}

// ---- small helpers -----------------------------------------------------------------------

function status(text) {
  $("#status").textContent = text;
}

// The stream's state, shown beside the session and readable by tests: connecting, open,
// reconnecting, closed.
function streamState(state) {
  const badge = $("#connection");
  badge.dataset.state = state;
  badge.textContent = {
    connecting: "connecting…", open: "live", reconnecting: "reconnecting…", closed: "offline",
  }[state] || state;
}

function headers(json, token) {
  const out = {};
  if (json) out["Content-Type"] = "application/json";
  if (token) out["Authorization"] = "Bearer " + token;
  return out;
}

// A JSON request with the conversation's token (or `token`); answers { ok, status, body },
// status 0 when the server cannot be reached.
async function call(method, path, body, token = saved.token) {
  let response;
  try {
    response = await fetch(route(path), {
      method,
      headers: headers(body !== undefined, token),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (_) {
    return { ok: false, status: 0, body: { code: "unreachable", message: "the server cannot be reached" } };
  }
  let parsed = null;
  try {
    parsed = await response.json();
  } catch (_) {
    parsed = { code: "unreadable", message: "the server's answer (" + response.status + ") was not JSON" };
  }
  return { ok: response.ok, status: response.status, body: parsed || {} };
}

// The URL of a route: `path` is relative ("status?…"), resolved beside the page's script.
function route(path) {
  return new URL(path, BASE).href;
}

function statusPath() {
  return "status?session_id=" + encodeURIComponent(saved.session_id);
}

// ---- the log -----------------------------------------------------------------------------

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
      // A resume starts a run too; only a run started by a message has its text here. The
      // text of a message another tab sent may arrive after its run's first chunk: the line
      // waits, hidden, for the storage event (fillSent).
      if (prefix || kind.resumes) break; // a resume has no message to show
      const sent = sentBetween(turnSeq, chunk.seq);
      const line = entry("user", sent ? "you: " + sent : "");
      line.dataset.after = String(turnSeq);
      line.dataset.seq = String(chunk.seq);
      line.hidden = !sent;
      turnSeq = chunk.seq;
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
    case "skill_loaded":
      entry("tool", who + "skill loaded: " + kind.name);
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
  "run_interrupted", "run_end", "skill_loaded",
];

// Chunks after which the calls waiting for the person may have changed.
const CHANGES_PENDING = new Set([
  "run_suspended", "run_end", "run_interrupted", "tool_approval_request",
  "tool_approval_response", "tool_end", "forwarded",
]);

function closeStream() {
  if (source) source.close();
  source = null;
  // A reconnect replays from the last chunk: half a reply would otherwise stay on screen.
  if (typing) {
    typing.remove();
    typing = null;
  }
}

function connect(from) {
  closeStream();
  const query = new URLSearchParams({
    session_id: saved.session_id, token: saved.token, until: "closed", from: String(from),
  });
  const stream = new EventSource(route("sse?" + query));
  source = stream;
  streamState("connecting");
  stream.onopen = () => {
    retryMs = 500;
    streamState("open");
    status("connected");
    // Pending calls are shown from the status, not the stream: they may have been asked
    // before this stream's first chunk, or the server restarted in between. An answer given
    // before a restart (or in a tab since closed) may still wait for its resume.
    refreshSoon(true);
  };
  for (const type of CHUNK_TYPES) stream.addEventListener(type, onChunk);
  stream.addEventListener("delta", onDelta);
  stream.addEventListener("end", (event) => {
    // The server ended the stream (shutting down, or idle): come back from where we are.
    let reason = "?";
    try {
      reason = JSON.parse(event.data).reason;
    } catch (_) { /* keep "?" */ }
    if (stream !== source) return;
    status("stream ended (" + reason + "), reconnecting…");
    reconnectLater();
  });
  stream.addEventListener("error", (event) => {
    if (stream !== source) return;
    // An `error` event with data is the server's own; without, the connection dropped or
    // was refused. Either way reopen with our own backoff from the last chunk shown:
    // EventSource's own retry waits seconds, and gives up for good on a refused reconnect
    // (a server that is still starting).
    if (event.data) {
      try {
        entry("error", "stream: " + JSON.parse(event.data).message);
      } catch (_) { /* not JSON: the reconnect says enough */ }
    }
    status("reconnecting…");
    reconnectLater();
  });
}

function reconnectLater() {
  closeStream();
  streamState("reconnecting");
  if (retryTimer) return;
  const wait = retryMs;
  retryMs = Math.min(retryMs * 2, 5000);
  const id = saved.session_id;
  retryTimer = setTimeout(async () => {
    retryTimer = null;
    if (!id || id !== saved.session_id || source) return;
    // A session the server no longer knows, or a token it no longer accepts, does not come
    // back by retrying; an unreachable server may.
    const probe = await call("GET", statusPath());
    if (id !== saved.session_id || source) return;
    if (probe.status === 401 || probe.status === 403 || probe.status === 404) {
      streamState("closed");
      status(probe.body.message + " — start a new conversation");
      return;
    }
    if (!probe.ok) {
      reconnectLater();
      return;
    }
    lookAgain = true;
    connect(lastSeq + 1);
  }, wait);
}

// The reply a streaming model is writing (`typing`): one line that grows with each text
// delta. Deltas are never stored (a reload does not replay them); the step's `text` chunk
// that follows carries the whole reply, and replaces the line.
function onDelta(event) {
  if (event.target !== source) return;
  const delta = JSON.parse(event.data);
  if (delta.type !== "text_delta") return;
  if (!typing) typing = entry("text typing", "");
  typing.textContent += delta.text;
  typing.scrollIntoView({ block: "nearest" });
}

function onChunk(event) {
  if (event.target !== source) return;
  const chunk = JSON.parse(event.data);
  if (chunk.seq <= lastSeq) return; // already shown
  if (typing) {
    typing.remove();
    typing = null;
  }
  lastSeq = chunk.seq;
  saved.lastSeq = lastSeq;
  save(true);
  learn(chunk);
  render(chunk);
  const type = chunk.kind.type;
  if (CHANGES_PENDING.has(type)) refreshSoon(false);
  if (type === "run_start") status("running");
  if (type === "run_end") status("run " + chunk.kind.status);
  // A run that stops adds steps: the open list shows them.
  if ((type === "run_end" || type === "run_suspended") && $("#history").open) showSteps();
}

// ---- what waits for the person ------------------------------------------------------------

// A request of a call is named by the session that owns it (the root, or a sub-agent under
// it), its id, and when it was asked: a call asked again (a reconciliation raised after
// another crash) is a new request with a card of its own.
function keyOf(sessionId, toolCallId, requestedAt) {
  return sessionId + "\n" + toolCallId + "\n" + (requestedAt ?? "");
}

function callKey(call) {
  return keyOf(call.session_id, call.tool_call_id, String(call.requested_at_ms ?? ""));
}

function cardKey(card) {
  return keyOf(card.dataset.sessionId, card.dataset.toolCallId, card.dataset.requestedAt);
}

// The calls this page saw answered (its own answer accepted, or another's first): the status
// of a remote sub-agent's call may still say it waits for a moment after its server took the
// answer (the root learns of it by asking that server), and the page must not wait on it.
let answeredHere = new Set();

function stillWaits(call) {
  return call.waiting && !answeredHere.has(callKey(call));
}

function cardOf(call) {
  const key = callKey(call);
  for (const card of $("#pending").querySelectorAll(".card")) {
    if (cardKey(card) === key) return card;
  }
  return null;
}

// Refreshes once at a time: while a refresh is under way, the chunks that arrive (a reload
// replays a whole conversation) ask for one more, not one each. `resume`: also resume a run
// whose calls all have their answers.
async function refreshSoon(resume) {
  if (resume) refreshResume = true;
  if (refreshing) {
    refreshAgain = true;
    return;
  }
  refreshing = true;
  try {
    do {
      refreshAgain = false;
      const wantsResume = refreshResume;
      refreshResume = false;
      const state = await refreshPending();
      if (wantsResume && state && nothingWaits(state)) resumeIfNothingWaits();
    } while (refreshAgain);
  } finally {
    refreshing = false;
  }
}

// The run is suspended and nothing in its tree waits for the person any more: every call of
// the session and of its sub-agents (here or on another server) has its answer or is past its
// deadline, so only a resume moves it on. Whatever the status word: a root waiting on its
// sub-agents is `suspended_awaiting_children`, and the answered call of a remote sub-agent is
// not listed at all. A resume while a sub-agent is still at work does no harm. A sub-agent
// whose server does not answer (listed in `unreachable`) is waited for too: its parent tries
// again by itself, and carries out the resume once that server is back.
function nothingWaits(state) {
  return (
    state.status.startsWith("suspended") &&
    !state.pending.some(stillWaits) &&
    !(state.unreachable || []).length
  );
}

// Whether the next status read is a first look (see `refreshPending`).
let lookAgain = true;

// A run that stopped before its end (the server was killed, or it was interrupted) goes on
// only when resumed: the page offers it. A resume after a crash may raise reconcile calls
// (did the call that was running take effect?), which then show as cards.
function showRecover(state) {
  const stopped = state.status === "interrupted" && !state.aborted;
  $("#recover").hidden = !stopped;
  if (!stopped) return;
  const crashed = state.error && state.error.code === "crashed";
  $("#recover-text").textContent = crashed
    ? "The server stopped while this conversation was running. Resume it to go on: a call it was making may need you to say whether it took effect."
    : "This conversation's run was interrupted. Resume it to go on.";
}

async function resumeStopped() {
  $("#resume-run").disabled = true;
  const reply = await call("POST", "resume", { session_id: saved.session_id });
  $("#resume-run").disabled = false;
  if (!reply.ok) {
    status("resume: " + reply.body.message);
    return;
  }
  $("#recover").hidden = true;
  refreshSoon(false);
}

// Shows a card for each call that waits, and settles the cards of calls that no longer do.
async function refreshPending() {
  const id = saved.session_id;
  if (!id) return null;
  const asked = ++statusAsked;
  // The first look at a conversation (after opening it, or after the server came back) asks
  // the server to wait a moment for its run to settle: that activates a session a crash left
  // marked running, which records its run interrupted (its `run_interrupted` chunk then
  // refreshes the page, if this read was too early), so the page can offer to resume it. A
  // plain read does not activate a session.
  const firstLook = lookAgain ? "&settle_ms=1" : "";
  lookAgain = false;
  const read = await call("GET", statusPath() + firstLook);
  if (id !== saved.session_id) return null; // the conversation changed meanwhile
  if (!read.ok) {
    status("status: " + read.body.message);
    return null;
  }
  const state = read.body;
  // Answers may come back out of order: an older one must not undo what a newer one showed
  // (settle a card as answered because the call was not asked yet when it was read).
  if (asked < statusShown) return state;
  statusShown = asked;
  const box = $("#pending");
  const listed = new Map(
    state.pending.map((call) => [callKey(call), call]));
  for (const call of state.pending) {
    if (call.waiting && !cardOf(call)) {
      const fresh = Cards.make(call, addressOf(call), answer, { link: approvalToken });
      // A new message abandons it in a chunk from here on.
      fresh.dataset.since = String(state.chunk_count);
      groupOf(call.session_id).appendChild(fresh);
      fresh.scrollIntoView({ block: "nearest" });
      Cards.focus(fresh);
    }
  }
  for (const card of box.querySelectorAll(".card:not(.done)")) {
    const call = listed.get(cardKey(card));
    // A card being answered here is settled by its own answer, one a message sent here
    // abandons by that message.
    if (card.dataset.busy || card.dataset.abandoning || (call && call.waiting)) continue;
    const why = whyGone(card, call);
    settle(card, why);
    if (why.startsWith("already answered")) card.dataset.settled = "elsewhere";
  }
  showRecover(state);
  if (state.status.startsWith("suspended")) {
    if (state.pending.some(stillWaits)) status("waiting for you");
    else if ((state.unreachable || []).length) status("waiting for another server to come back…");
    else status("answered, resuming…");
  }
  return state;
}

// What became of the call of a card that no longer waits (`call`: how the status lists it
// now, if it does), answered neither here nor by a message sent here.
function whyGone(card, call) {
  if (call && !call.answered && call.deadline_at_ms <= Date.now()) {
    return "no longer waiting: its time ran out";
  }
  if (!call && abandonedByMessage(card)) return "abandoned by a new message";
  return "already answered (maybe in another tab)";
}

// What the stream says about the calls that wait: which root call each sub-agent works for,
// and which root calls a new message abandoned (the runtime records `client_tool_abandoned`
// or `sub_agent_abandoned` as their results; that message may come from another tab).
function learn(chunk) {
  const kind = chunk.kind;
  if (kind.type === "subagent_start") rootCallOf.set(kind.session_id, kind.tool_call_id);
  learnParent(kind, saved.session_id);
  if (kind.type === "forwarded") {
    // Every session that reports through this child works for the same root call.
    for (let inner = kind; inner; inner = inner.chunk && inner.chunk.kind) {
      if (inner.type === "forwarded" || inner.type === "subagent_start") {
        rootCallOf.set(inner.session_id, kind.tool_call_id);
      }
    }
  }
  const error = kind.type === "tool_end" && kind.outcome && kind.outcome.error;
  if (typeof error === "string" && /^(client_tool|sub_agent)_abandoned\b/.test(error)) {
    abandonedAt.set(kind.tool_call_id, chunk.seq);
    // A status read may have seen the call go first, and called it answered.
    for (const shown of $("#pending").querySelectorAll(".card")) {
      const open = !shown.classList.contains("done") || shown.dataset.settled === "elsewhere";
      if (open && !shown.dataset.busy && !shown.dataset.abandoning && abandonedByMessage(shown)) {
        settle(shown, "abandoned by a new message");
      }
    }
  }
}

// Which session started each sub-agent, and by which call: a `subagent_start`, here or
// forwarded from the sub-agent (the innermost forwarding session) that started it.
function learnParent(kind, parent) {
  if (kind.type === "subagent_start") {
    parentOf.set(kind.session_id, { parent, call: kind.tool_call_id });
  } else if (kind.type === "forwarded" && kind.chunk) {
    learnParent(kind.chunk.kind, kind.session_id);
  }
}

// Where the cards of `session`'s calls go: the root's in the list, a sub-agent's in a group
// of its own, nested in the group of the session that started it.
function groupOf(session) {
  const top = $("#pending");
  if (!session || session === saved.session_id) return top;
  for (const group of top.querySelectorAll("section.subagent")) {
    if (group.dataset.sessionId === session) return group;
  }
  const known = parentOf.get(session);
  const group = document.createElement("section");
  group.className = "subagent";
  group.dataset.sessionId = session;
  const heading = document.createElement("h3");
  heading.id = "group-" + groupCount++;
  heading.textContent = "Sub-agent " + session + (known ? " (started by " + known.call + ")" : "") + " asks:";
  group.setAttribute("aria-labelledby", heading.id);
  group.appendChild(heading);
  groupOf(known ? known.parent : saved.session_id).appendChild(group);
  return group;
}
let groupCount = 0;

// Drops the groups of sub-agents that have no card left.
function dropEmptyGroups() {
  for (const group of [...$("#pending").querySelectorAll("section.subagent")].reverse()) {
    if (!group.querySelector(".card")) group.remove();
  }
}

// Whether a new message abandoned the card's call: its root call (the call itself, or the one
// that started the sub-agent it belongs to) was, after the card was shown.
function abandonedByMessage(card) {
  const root = card.dataset.sessionId === saved.session_id
    ? card.dataset.toolCallId : rootCallOf.get(card.dataset.sessionId);
  const at = root === undefined ? undefined : abandonedAt.get(root);
  return at !== undefined && at >= Number(card.dataset.since);
}

// A token for the approval `request` names, with the conversation's token: the card's "Link
// for another device".
function approvalToken(request) {
  return call("POST", "approval-token", request);
}

// Where an answer for `call` goes: always the root, naming the session that made the call
// (two sub-agents may both wait on a `tc-1`).
function addressOf(call) {
  return {
    session_id: saved.session_id,
    tool_call_id: call.tool_call_id,
    owner_session_id: call.session_id,
  };
}

// Submits an answer; once it is accepted and nothing else waits, resumes the run.
async function answer(box, envelope) {
  box.dataset.busy = "1";
  controls(box, false);
  const reply = await call("POST", "submit-tool-result", envelope);
  delete box.dataset.busy;
  if (reply.ok || reply.body.code === "already_completed") {
    answeredHere.add(cardKey(box));
  }
  if (reply.ok) {
    settle(box, "sent");
  } else if (reply.body.code === "already_completed") {
    // Another tab (or a retry) answered first, and the first answer wins; or a new message
    // abandoned the call.
    if (abandonedByMessage(box)) {
      settle(box, "abandoned by a new message");
    } else {
      settle(box, "already answered (maybe in another tab)");
      box.dataset.settled = "elsewhere";
    }
  } else {
    controls(box, true);
    Cards.refused(box, reply);
    // The call still waits, as it is now: its card is shown again, with what happened.
    if (reply.body.code === "stale_approval") await showAgain(box);
    return;
  }
  await resumeIfNothingWaits();
}

// Replaces the card of a call whose request changed since it was shown with one of the
// request as it is now, saying why.
async function showAgain(box) {
  const key = cardKey(box);
  box.remove();
  await refreshPending();
  for (const fresh of $("#pending").querySelectorAll(".card:not(.done)")) {
    if (cardKey(fresh) !== key) continue;
    note(fresh, STALE_TEXT);
    Cards.focus(fresh);
  }
}

// Resumes once every call has its answer (a run resumed with calls still waiting would
// only suspend again). One check at a time; an answer that comes in during one is looked at
// by a second.
async function resumeIfNothingWaits() {
  if (resuming) {
    resumeAgain = true;
    return;
  }
  resuming = true;
  try {
    do {
      resumeAgain = false;
      const state = await refreshPending();
      if (!state || !nothingWaits(state)) continue;
      const reply = await call("POST", "resume", { session_id: state.session_id });
      // Another tab resumed first, or the run went on by itself (a deadline): not a problem.
      const benign = reply.body.code === "already_running" || reply.body.code === "not_resumable";
      // A resume while the server is away fails: the stream's reconnect checks again (onopen).
      if (!reply.ok && !benign) status("resume: " + reply.body.message);
    } while (resumeAgain);
  } finally {
    resuming = false;
  }
}

// ---- sending ----------------------------------------------------------------------------

async function send(event) {
  event.preventDefault();
  const text = $("#message").value.trim();
  if (!text) return;
  $("#send").disabled = true;
  try {
    // A new message abandons the calls that still wait for the person: ask first.
    const waiting = saved.session_id ? await waitingCount() : 0;
    if (waiting > 0) {
      askBeforeSending(waiting);
      return;
    }
    await post(text, false);
  } finally {
    $("#send").disabled = false;
  }
}

// How many calls of the conversation's tree wait for the person, as the server says now.
async function waitingCount() {
  const state = await refreshPending();
  return state ? state.pending.filter(stillWaits).length : 0;
}

function askBeforeSending(count) {
  const calls = count === 1 ? "1 call still waits" : count + " calls still wait";
  $("#confirm-text").textContent = calls + " for you. A new message abandons " +
    (count === 1 ? "it" : "them") + ": send anyway?";
  $("#confirm").hidden = false;
  $("#send-anyway").focus();
}

$("#send-anyway").addEventListener("click", async () => {
  $("#confirm").hidden = true;
  const text = $("#message").value.trim();
  if (!text) return;
  $("#send").disabled = true;
  try {
    await post(text, true);
  } finally {
    $("#send").disabled = false;
  }
});

$("#keep").addEventListener("click", () => {
  $("#confirm").hidden = true;
  status("not sent: answer what waits, or send anyway");
  $("#message").focus();
});

// Starts a turn with `text` (a new session, or the next turn of this one). `abandoning`: the
// person chose to send over calls that still wait; their cards say what became of them.
async function post(text, abandoning) {
  const body = { agent: AGENT, message: text };
  // A following message is a new turn of the same session, authorized by its token.
  if (saved.session_id) body.session_id = saved.session_id;
  // Marked while the message is on its way: a status read meanwhile (the stream's chunks
  // trigger them) must not call them answered.
  const abandoned = abandoning ? [...$("#pending").querySelectorAll(".card:not(.done)")] : [];
  for (const shown of abandoned) shown.dataset.abandoning = "1";
  const reply = await call("POST", "start", body);
  for (const shown of abandoned) delete shown.dataset.abandoning;
  if (!reply.ok) {
    const hint = reply.status === 401 || reply.status === 403 || reply.status === 404
      ? " — start a new conversation" : "";
    status(reply.body.code + ": " + reply.body.message + hint);
    return;
  }
  $("#message").value = "";
  $("#confirm").hidden = true;
  const fresh = saved.session_id !== reply.body.session_id;
  saved.session_id = reply.body.session_id;
  saved.token = reply.body.token || saved.token;
  saved.sent = Object.assign(fresh ? {} : saved.sent || {}, { [reply.body.from_seq]: text });
  if (fresh) {
    saved.since = Date.now();
    saved.lastSeq = -1;
    clearLog();
  }
  save();
  // On a stream already open, the run's first chunk may have come before this answer.
  fillSent();
  showSession();
  // The answered cards of earlier turns go; the abandoned ones stay a turn, saying so.
  for (const done of $("#pending").querySelectorAll(".card.done")) done.remove();
  dropEmptyGroups();
  for (const shown of abandoned) {
    if (shown.isConnected) settle(shown, "abandoned by your new message");
  }
  if (fresh || !source) connect(lastSeq + 1);
}

// Empties the log, and all the page learned from the chunks it showed.
function clearLog() {
  lastSeq = -1;
  turnSeq = -1;
  rootCallOf = new Map();
  parentOf = new Map();
  abandonedAt = new Map();
  $("#log").textContent = "";
}

function showSession() {
  $("#session").textContent = saved.session_id ? "session " + saved.session_id : "no conversation yet";
}

// Shows the conversation `state` holds (or none): the log rebuilt from its first chunk,
// then followed live, and the calls that wait.
function open(state) {
  closeStream();
  answeredHere = new Set();
  if (retryTimer) clearTimeout(retryTimer);
  retryTimer = null;
  retryMs = 500;
  saved = state;
  clearLog();
  $("#pending").textContent = "";
  $("#confirm").hidden = true;
  $("#recover").hidden = true;
  lookAgain = true;
  $("#steps").textContent = "";
  if ($("#history").open) showSteps();
  showSession();
  status("");
  if (saved.session_id && saved.token) {
    connect(0);
  } else {
    streamState("closed");
  }
}

// ---- steps and forks ---------------------------------------------------------------------

// One line of a step: what its commit recorded, briefly.
function stepText(checkpoint) {
  const said = checkpoint.messages.map((message) => {
    if (message.role === "user") return "you: " + message.text;
    if (message.role === "assistant") {
      const calls = (message.tool_calls || []).map((call) => "→ " + call.name);
      return [message.text || "", ...calls].filter(Boolean).join(" ");
    }
    if (message.role === "tool") return "← " + message.tool_name;
    return "";
  }).filter(Boolean).join("; ");
  return "#" + checkpoint.id + " turn " + checkpoint.turn + ", step " + checkpoint.step +
    ": " + checkpoint.status.replace(/_/g, " ") + (said ? " — " + said : "");
}

// Lists the conversation's steps, each with a way to fork from it.
async function showSteps() {
  const list = $("#steps");
  if (!saved.session_id) {
    list.textContent = "";
    return;
  }
  const reply = await call("GET", "checkpoints?session_id=" + encodeURIComponent(saved.session_id));
  if (!reply.ok) {
    status(reply.body.code + ": " + reply.body.message);
    return;
  }
  list.textContent = "";
  for (const checkpoint of reply.body.checkpoints) {
    const item = document.createElement("li");
    const text = document.createElement("span");
    text.textContent = stepText(checkpoint);
    const fork = document.createElement("button");
    fork.type = "button";
    fork.textContent = "Fork from here";
    fork.setAttribute("aria-label", "Fork from step " + checkpoint.id);
    fork.dataset.checkpoint = String(checkpoint.id);
    fork.addEventListener("click", () => forkFrom(checkpoint.id));
    item.append(text, fork);
    list.appendChild(item);
  }
}

// Forks the conversation at a step (with the last message edited, if one was typed) and
// opens the fork: its own session, with the history up to there and what waited there.
async function forkFrom(checkpoint) {
  const body = { session_id: saved.session_id, checkpoint };
  const edited = $("#fork-message").value.trim();
  if (edited) body.edit_message = edited;
  status("forking from step #" + checkpoint + "…");
  const reply = await call("POST", "fork", body);
  if (!reply.ok) {
    status(reply.body.code + ": " + reply.body.message);
    return;
  }
  const fork = { session_id: reply.body.session_id, token: reply.body.token, since: Date.now() };
  // The fork's messages, by the first chunk of their turns, so its log shows them.
  const steps = await call(
    "GET", "checkpoints?session_id=" + encodeURIComponent(fork.session_id), undefined, fork.token,
  );
  fork.sent = {};
  let from = 0;
  for (const step of steps.ok ? steps.body.checkpoints : []) {
    const message = step.messages.find((m) => m.role === "user");
    if (message) fork.sent[from] = message.text;
    from = step.stream_seq;
  }
  $("#fork-message").value = "";
  open(fork);
  save();
  status("forked from step #" + checkpoint + " of the previous conversation");
}

$("#history").addEventListener("toggle", () => {
  if ($("#history").open) showSteps();
});

$("#compose").addEventListener("submit", send);
$("#resume-run").addEventListener("click", resumeStopped);
$("#new").addEventListener("click", () => {
  open({ since: Date.now() });
  save();
  $("#message").focus();
});
open(saved);
