// The inbox view: every call that waits for a person, across sessions (`GET /inbox`), each
// answerable in place with the conversation's cards, filtered by agent, kind and tool, read
// page by page. The inbox lists every session's calls, so the server answers it to an operator
// only: the page sends the API key the person gives it (`x-api-key`, kept for this tab only)
// and its cookies (for an authenticate hook that reads them). Needs page.js (route, open).
"use strict";

const OPERATOR_KEY = STORE_KEY + ":operator";
const ANSWERED_KEY = STORE_KEY + ":inbox-answered";
const INBOX_POLL_MS = 2000;

// Calls read at once (the list's `data-page-size` may say fewer).
function pageSize() {
  return Math.min(Number($("#inbox-list").dataset.pageSize) || 50, 500);
}

let inboxNext = null; // the cursor of the next page
let inboxTimer = null;
let inboxEpoch = 0; // counts reads: an answer that a later read overtook is dropped
const answeredKeys = new Set(); // items answered here or in another tab: never shown again

function operatorKey() {
  try {
    return sessionStorage.getItem(OPERATOR_KEY) || "";
  } catch (_) {
    return "";
  }
}

// A request with the operator's credentials; answers { ok, status, body } as `call` does.
async function operatorCall(method, path, body) {
  const sent = { "Content-Type": "application/json" };
  const key = operatorKey();
  if (key) sent["x-api-key"] = key;
  let response;
  try {
    response = await fetch(route(path), {
      method,
      headers: sent,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (_) {
    return { ok: false, status: 0, body: { code: "unreachable", message: "the server cannot be reached" } };
  }
  let parsed = {};
  try {
    parsed = (await response.json()) || {};
  } catch (_) {
    parsed = { code: "unreadable", message: "the server's answer (" + response.status + ") was not JSON" };
  }
  return { ok: response.ok, status: response.status, body: parsed };
}

// ---- the list ----------------------------------------------------------------------------

function inboxQuery(after, limit) {
  const query = new URLSearchParams();
  const agent = $("#filter-agent").value.trim();
  const kind = $("#filter-kind").value;
  const tool = $("#filter-tool").value.trim();
  if (agent) query.set("agent", agent);
  if (kind) query.set("kind", kind);
  if (tool) query.set("tool", tool);
  if (after) query.set("after", after);
  query.set("limit", String(limit));
  return "inbox?" + query.toString();
}

function inboxStatus(text) {
  $("#inbox-status").textContent = text;
}

// No operator credentials (or refused ones): said plainly, with a way to give a key.
function needsOperator(reply) {
  const refused = reply.status === 401 || reply.status === 403;
  $("#inbox-auth").hidden = !refused;
  if (!refused) return false;
  const given = operatorKey();
  $("#inbox-auth-text").textContent = (given
    ? "The server refused the API key this page sent (" + reply.body.message + "). "
    : "The inbox lists the calls of every session, so only an operator may read it, and this page has no operator credentials (the server said: " + reply.body.message + "). ") +
    "Enter the server's API key to see it.";
  $("#inbox-list").textContent = "";
  $("#inbox-more").hidden = true;
  inboxStatus("");
  return true;
}

// An item is a request of a call: a call asked again (a reconciliation raised a second time)
// is a new item, shown though the first was answered.
function itemKey(item) {
  return item.session + "\n" + item.tool_call_id + "\n" + item.since_ms;
}

function shownItems() {
  return [...$("#inbox-list").querySelectorAll("li.inbox-item")];
}

function when(ms) {
  return new Date(ms).toLocaleString();
}

// One line of the list: who waits on what since when, a way to open its conversation, and
// its card.
function inboxItem(item) {
  const li = document.createElement("li");
  li.className = "inbox-item";
  li.dataset.key = itemKey(item);
  li.dataset.sessionId = item.session;
  li.dataset.root = item.root;
  li.dataset.toolCallId = item.tool_call_id;
  li.dataset.deadline = String(item.deadline_at_ms);
  const about = document.createElement("p");
  about.className = "about";
  about.textContent = item.agent + " · " + item.tool_name + " (" + item.kind + ") · session " +
    item.session + (item.session === item.root ? "" : " under " + item.root) +
    " · waiting since " + when(item.since_ms) + " · answer by " + when(item.deadline_at_ms);
  const openIt = button("Open conversation", "open");
  openIt.setAttribute("aria-label", "Open the conversation of session " + item.root);
  openIt.addEventListener("click", () => openConversation(item.root));
  about.append(" ", openIt);
  const call = {
    session_id: item.session, tool_call_id: item.tool_call_id, tool_name: item.tool_name,
    kind: item.kind, approval_id: item.approval_id, input: item.input, binding: item.binding,
    description: item.description, input_schema: item.input_schema,
    output_schema: item.output_schema, editable: item.editable,
    idempotency_key: item.idempotency_key, request: item.request, question: item.question,
  };
  const address = { session_id: item.root, tool_call_id: item.tool_call_id, owner_session_id: item.session };
  li.append(about, Cards.make(call, address, answerFromInbox, {
    link: (request) => operatorCall("POST", "approval-token", request),
  }));
  return li;
}

// Reads the first page again (`more`: the next one, added below).
async function readInbox(more) {
  const epoch = ++inboxEpoch;
  const reply = await operatorCall("GET", inboxQuery(more ? inboxNext : null, pageSize()));
  if (epoch !== inboxEpoch) return;
  if (needsOperator(reply)) return;
  if (!reply.ok) {
    inboxStatus("inbox: " + reply.body.code + ": " + reply.body.message);
    return;
  }
  if (!more) {
    // Another list (a filter changed, or a reload): what was said of the last one goes.
    $("#inbox-list").textContent = "";
    doneSaid = "";
  }
  const shown = new Set(shownItems().map((li) => li.dataset.key));
  for (const item of reply.body.items) {
    if (!shown.has(itemKey(item)) && !answeredKeys.has(itemKey(item))) {
      $("#inbox-list").appendChild(inboxItem(item));
    }
  }
  inboxNext = reply.body.next || null;
  $("#inbox-more").hidden = !inboxNext;
  countShown();
}

// Says how many calls are shown, when that changed (the status line is read out: a look
// every 2 s must not repeat it). What the person last did here (or what went wrong) is said
// before the count until the count changes again: a look that finds the same calls must not
// wipe it.
let countSaid = null;
let doneSaid = "";
function countShown() {
  const count = shownItems().length;
  const text = count === 0 ? "Nothing waits for a person." :
    count + (count === 1 ? " call waits" : " calls wait") + (inboxNext ? " (more below)" : "") + ".";
  if (text !== countSaid) doneSaid = "";
  const line = doneSaid ? doneSaid + " " + text : text;
  if (text === countSaid && $("#inbox-status").textContent === line) return;
  countSaid = text;
  inboxStatus(line);
}

// Says what the person just did, with the count it left.
function sayBeforeCount(text) {
  countShown();
  doneSaid = text;
  countShown();
}

// Looks again at what is shown (as many as are shown, from the first; "Load more" reads on):
// calls answered
// elsewhere go, new ones come in where their deadline puts them. A card being filled in stays.
async function pollInbox() {
  if ($("#inbox-view").hidden || document.hidden) return;
  const epoch = inboxEpoch;
  const limit = Math.min(shownItems().length || pageSize(), 500);
  const reply = await operatorCall("GET", inboxQuery(null, limit));
  if (epoch !== inboxEpoch || needsOperator(reply) || !reply.ok) return;
  if (!reply.body.next) {
    // Everything is shown: nothing more to load.
    inboxNext = null;
    $("#inbox-more").hidden = true;
  }
  const fresh = new Map(reply.body.items.map((item) => [itemKey(item), item]));
  const items = reply.body.items;
  const last = items.length ? items[items.length - 1].deadline_at_ms : 0;
  for (const li of shownItems()) {
    // Gone, unless it may lie past what this read reached (a page further on). An item whose
    // deadline equals the read's last may be on the next page too (ties go on by key): a
    // look that began before "Load more" added it reads fewer than are shown now.
    const past = reply.body.next && Number(li.dataset.deadline) >= last;
    if (!fresh.has(li.dataset.key) && !past && !li.querySelector("[data-busy]")) gone(li);
  }
  const shown = new Set(shownItems().map((li) => li.dataset.key));
  for (const item of items) {
    if (shown.has(itemKey(item)) || answeredKeys.has(itemKey(item))) continue;
    const later = shownItems().find((li) => Number(li.dataset.deadline) > item.deadline_at_ms);
    $("#inbox-list").insertBefore(inboxItem(item), later || null);
  }
  countShown();
}

// An item no longer waits: it leaves the list (the status line says so, for a screen reader).
function gone(li) {
  answeredKeys.add(li.dataset.key);
  const focused = li.contains(document.activeElement);
  const next = li.nextElementSibling || li.previousElementSibling;
  li.remove();
  if (focused && next) Cards.focus(next);
  if (focused && !next) $("#inbox-reload").focus();
}

// Answers an item (at its root, naming its session) and resumes the root: a resume that finds
// calls still waiting ends at once.
async function answerFromInbox(box, envelope) {
  box.dataset.busy = "1";
  controls(box, false);
  const reply = await operatorCall("POST", "submit-tool-result?resume=true", envelope);
  delete box.dataset.busy;
  const li = box.closest("li.inbox-item");
  if (reply.ok || reply.body.code === "already_completed") {
    const key = li.dataset.key;
    gone(li);
    sayBeforeCount(reply.ok ? "Answered: " + box.dataset.tool + " of session " + box.dataset.sessionId + "."
      : "Already answered elsewhere: " + box.dataset.tool + ".");
    tellOtherTabs(key);
    return;
  }
  controls(box, true);
  Cards.refused(box, reply);
  if (reply.body.code === "stale_approval") {
    // The call still waits, changed: shown again as it is now.
    li.remove();
    await pollInbox();
    const again = shownItems().find((other) => other.dataset.key === li.dataset.key);
    if (again) {
      note(again.querySelector(".card"), STALE_TEXT);
      Cards.focus(again);
    }
  }
}

// Another tab of this page showing the inbox drops the item at once (the poll would, later).
function tellOtherTabs(key) {
  try {
    localStorage.setItem(ANSWERED_KEY, JSON.stringify({ key, at: Date.now() }));
  } catch (_) {
    // No storage: the other tabs see it go at their next look.
  }
}

window.addEventListener("storage", (event) => {
  if (event.key !== ANSWERED_KEY || !event.newValue) return;
  let told = {};
  try {
    told = JSON.parse(event.newValue) || {};
  } catch (_) {
    return;
  }
  answeredKeys.add(told.key);
  for (const li of shownItems()) {
    if (li.dataset.key === told.key) gone(li);
  }
  countShown();
});

// Opens the conversation of `root` in this page: its token, from the operator's credentials.
async function openConversation(root) {
  const reply = await operatorCall("POST", "token", { session_id: root });
  if (!reply.ok) {
    sayBeforeCount("cannot open session " + root + ": " + reply.body.code + ": " + reply.body.message);
    return;
  }
  open({ session_id: root, token: reply.body.token, since: Date.now() });
  save();
  showView("conversation");
}

// ---- the two views -------------------------------------------------------------------------

function showView(view) {
  const inbox = view === "inbox";
  $("#inbox-view").hidden = !inbox;
  $("#conversation-view").hidden = inbox;
  $("#view-inbox").setAttribute("aria-pressed", String(inbox));
  $("#view-conversation").setAttribute("aria-pressed", String(!inbox));
  const hash = inbox ? "#inbox" : "";
  if (location.hash !== hash) history.replaceState(null, "", location.pathname + location.search + hash);
  if (inboxTimer) clearInterval(inboxTimer);
  inboxTimer = null;
  if (inbox) {
    readInbox(false);
    inboxTimer = setInterval(pollInbox, INBOX_POLL_MS);
    $("#view-inbox").focus();
  }
}

$("#view-inbox").addEventListener("click", () => showView("inbox"));
$("#view-conversation").addEventListener("click", () => showView("conversation"));
$("#inbox-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  readInbox(false);
});
$("#inbox-reload").addEventListener("click", () => readInbox(false));
$("#inbox-more").addEventListener("click", () => readInbox(true));
$("#use-key").addEventListener("click", () => {
  try {
    sessionStorage.setItem(OPERATOR_KEY, $("#operator-key").value.trim());
  } catch (_) {
    // No storage: nothing kept.
  }
  $("#operator-key").value = "";
  readInbox(false);
});
if (location.hash === "#inbox") showView("inbox");
