// The cards of calls that wait for a person, the same in the conversation and in the inbox: a
// client tool's form (from its output schema), an approval (the tool's description, its
// arguments as a table, an edit from its input schema when it allows one), a reconciliation
// (a call a crash cut: did its effect happen?), a tool's question (a form from the schema it
// asked for), and, for a kind of
// call this page does not know yet, its input and a raw-JSON answer. Each view says where an
// answer goes (`address`) and sends it (`answer(box, envelope)`); `Cards.refused` shows a
// refusal on the card.
"use strict";

const STALE_TEXT = "This request changed since you saw it (its input or its tool changed), " +
  "so your decision was not applied. It is shown again below as it is now: decide again.";

function card(call, title) {
  const box = document.createElement("form");
  box.className = "card";
  box.dataset.sessionId = call.session_id;
  box.dataset.toolCallId = call.tool_call_id;
  box.dataset.kind = call.kind;
  box.dataset.tool = call.tool_name;
  // Which request of the call: one asked again (a reconciliation after another crash) is
  // another card.
  box.dataset.requestedAt = String(call.requested_at_ms ?? call.since_ms ?? "");
  const heading = document.createElement("h2");
  heading.id = "card-" + Math.random().toString(36).slice(2);
  heading.textContent = title;
  box.setAttribute("aria-labelledby", heading.id);
  box.appendChild(heading);
  if (call.description) {
    const what = document.createElement("p");
    what.className = "description";
    what.textContent = call.description;
    box.appendChild(what);
  }
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
  let line = box.querySelector(":scope > .note");
  if (!line) {
    line = document.createElement("p");
    line.className = "note";
    line.setAttribute("role", "status");
    box.appendChild(line);
  }
  line.textContent = text;
}

function controls(box, enabled) {
  for (const element of box.querySelectorAll("button, input, textarea, select")) {
    element.disabled = !enabled;
  }
}

// A card whose call is answered: it stays, greyed, with what happened, until the next
// message (the log shows the outcome once the run moves on).
function settle(box, text) {
  delete box.dataset.settled;
  controls(box, false);
  note(box, text);
  box.classList.add("done");
}

function actions(...elements) {
  const row = document.createElement("div");
  row.className = "actions";
  row.append(...elements);
  return row;
}

// ---- a call's arguments, readable ---------------------------------------------------------

// A value as a person reads it: text as text, an object as a key / value table, a list as a
// list, anything else as JSON. Built from text nodes only: nothing in a value becomes HTML.
function readable(value) {
  if (typeof value === "string") {
    const text = document.createElement("span");
    text.textContent = value;
    return text;
  }
  if (Array.isArray(value) && value.length) {
    const list = document.createElement("ol");
    for (const item of value) {
      const li = document.createElement("li");
      li.appendChild(readable(item));
      list.appendChild(li);
    }
    return list;
  }
  if (value !== null && typeof value === "object" && Object.keys(value).length) {
    return argsTable(value);
  }
  const code = document.createElement("code");
  code.textContent = JSON.stringify(value);
  return code;
}

function argsTable(input) {
  const table = document.createElement("table");
  table.className = "args";
  for (const [key, value] of Object.entries(input)) {
    const row = table.insertRow();
    const name = document.createElement("th");
    name.scope = "row";
    name.textContent = key;
    const cell = row.insertCell();
    row.insertBefore(name, cell);
    cell.appendChild(readable(value));
  }
  return table;
}

// The call's input: a table for an object, else the value itself.
function inputOf(call) {
  const input = call.input;
  const shown = input !== null && typeof input === "object" && !Array.isArray(input)
    ? argsTable(input) : readable(input);
  shown.classList.add("input");
  return shown;
}

// ---- the cards -----------------------------------------------------------------------------

// A client tool: its input, and a form for its result (generated from its output schema).
// `asked`, for a tool's question: the card's title and the schema of the answer instead.
function clientCard(call, address, answer, asked) {
  const title = asked ? asked.title : "The agent asks (" + call.tool_name + ")";
  const box = card(call, title);
  const form = asked
    ? SchemaForm.build(asked.schema, undefined, "Answer")
    : SchemaForm.build(call.output_schema, undefined, "Result of " + call.tool_name);
  box.schemaForm = form;
  const send = button("Submit", "submit", true);
  const decline = button("Decline", "decline");
  send.addEventListener("click", () => {
    const read = form.read();
    if (read.errors) {
      note(box, "Fix the " + (read.errors === 1 ? "marked field" : read.errors + " marked fields") + " first (nothing went to the server).");
      return;
    }
    answer(box, { ...address, result: read.value });
  });
  decline.addEventListener("click", () => answer(box, { ...address, error: "declined by the user" }));
  box.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!send.disabled) send.click();
  });
  if (!(call.input && typeof call.input === "object" && !Object.keys(call.input).length)) {
    box.append(inputOf(call));
  }
  box.append(form.element, actions(send, decline));
  return box;
}

// An approval gate: what the tool does, its arguments, approve or deny with a reason; an edit
// of the input first when the tool allows it. The decision names the request it was made for
// (`binding`), so a changed call refuses it.
function approvalCard(call, address, answer, options) {
  const box = card(call, "Approve " + call.tool_name + "?");
  if (call.binding) box.dataset.binding = call.binding;
  const shown = inputOf(call);
  const reason = document.createElement("input");
  reason.type = "text";
  reason.name = "reason";
  reason.autocomplete = "off";
  reason.placeholder = "reason (optional)";
  reason.setAttribute("aria-label", "Reason (optional)");
  const approve = button("Approve", "approve", true);
  const deny = button("Deny", "deny");
  let editing = null; // the form of the edit under way
  const decide = (approved) => {
    const envelope = {
      kind: "approval-response", ...address, approval_id: call.approval_id, approved,
    };
    // Read when sent, not when shown: the binding of the request this card shows.
    if (box.dataset.binding) envelope.binding = box.dataset.binding;
    if (reason.value.trim()) envelope.reason = reason.value.trim();
    if (approved && editing) {
      const read = editing.read();
      if (read.errors) {
        note(box, "Fix the " + (read.errors === 1 ? "marked field" : read.errors + " marked fields") + " first (nothing went to the server).");
        return;
      }
      envelope.edited_input = read.value;
    }
    answer(box, envelope);
  };
  approve.addEventListener("click", () => decide(true));
  deny.addEventListener("click", () => decide(false));
  box.addEventListener("submit", (event) => event.preventDefault());
  const row = actions(reason, approve, deny);
  if (call.editable) {
    const edit = button("Edit", "edit");
    edit.setAttribute("aria-expanded", "false");
    edit.addEventListener("click", () => {
      if (editing) {
        editing.element.remove();
        editing = null;
        box.schemaForm = null;
        shown.hidden = false;
        edit.textContent = "Edit";
        approve.textContent = "Approve";
        edit.setAttribute("aria-expanded", "false");
        return;
      }
      editing = SchemaForm.build(call.input_schema, call.input, "Input of " + call.tool_name);
      box.schemaForm = editing;
      shown.hidden = true;
      shown.after(editing.element);
      edit.textContent = "Cancel edit";
      approve.textContent = "Approve with edits";
      edit.setAttribute("aria-expanded", "true");
      editing.focus();
    });
    row.append(edit);
  }
  if (options && options.link && call.approval_id) {
    const link = button("Link for another device", "device-link");
    link.addEventListener("click", () => offerDeviceLink(box, address, options.link));
    row.append(link);
  }
  box.append(shown, row);
  return box;
}

// A tool that asked a person while it ran (`input`, an MCP server's elicitation among them):
// its question, a form from the schema it asked for, and a refusal (the tool hears "declined").
function inputCard(call, address, answer) {
  const request = call.request || {};
  const title = request.message || call.tool_name + " asks for input";
  // Names its question: a retried answer to an earlier one is not taken for this one.
  const asked = { ...address };
  if (call.question) asked.question = call.question;
  return clientCard(call, asked, answer, { title: title, schema: request.schema || null });
}

// A call a crash cut while it ran (`reconcile`): its effect may or may not have happened. The
// person looks it up by the call's idempotency key and says which: it happened (with what it
// returned: the call's result; the tool does not run again), it did not (the tool runs once
// more), or it failed (with the error).
function reconcileCard(call, address, answer) {
  const box = card(call, "Did " + call.tool_name + " take effect?");
  const why = document.createElement("p");
  why.className = "explain";
  why.textContent = "The process stopped while this call was running, so its effect may or may " +
    "not have happened. Look it up, then say what became of it.";
  box.append(why);
  if (call.idempotency_key) {
    const key = document.createElement("p");
    key.className = "idempotency-key";
    key.append("Idempotency key: ");
    const code = document.createElement("code");
    code.textContent = call.idempotency_key;
    key.append(code);
    box.append(key);
  }
  box.append(inputOf(call));
  const result = SchemaForm.build(call.output_schema, undefined, "What it returned, if it happened");
  box.schemaForm = result;
  const error = document.createElement("input");
  error.type = "text";
  error.name = "error";
  error.autocomplete = "off";
  error.placeholder = "what went wrong, if it failed";
  error.setAttribute("aria-label", "What went wrong, if it failed");
  const happened = button("It happened", "happened", true);
  const didNot = button("It did not happen: run it again", "did-not-happen");
  const failed = button("It failed", "failed");
  const envelope = (fields) => ({ kind: "reconcile", ...address, ...fields });
  happened.addEventListener("click", () => {
    const read = result.read();
    if (read.errors) {
      note(box, "Say what it returned in the marked fields first (nothing went to the server).");
      return;
    }
    answer(box, envelope({ happened: true, result: read.value }));
  });
  didNot.addEventListener("click", () => answer(box, envelope({ happened: false })));
  failed.addEventListener("click", () => {
    if (!error.value.trim()) {
      note(box, "Say what went wrong first (nothing went to the server).");
      error.focus();
      return;
    }
    answer(box, envelope({ error: error.value.trim() }));
  });
  box.addEventListener("submit", (event) => event.preventDefault());
  box.append(result.element, actions(happened, didNot), actions(error, failed));
  return box;
}

// A kind of call this page does not know: its input, and the answer's fields as raw JSON,
// added to the envelope as they are.
function otherCard(call, address, answer) {
  const box = card(call, call.tool_name + " waits for you (" + call.kind + ")");
  const form = SchemaForm.build(null, {}, "Answer's fields");
  box.schemaForm = form;
  const send = button("Send", "submit", true);
  send.addEventListener("click", () => {
    const read = form.read();
    if (read.errors) return;
    answer(box, { ...read.value, ...address });
  });
  box.addEventListener("submit", (event) => event.preventDefault());
  box.append(inputOf(call), form.element, actions(send));
  return box;
}

const Cards = {
  // The card for `call` (as /status or the inbox lists it: session_id, tool_call_id,
  // tool_name, kind, input, and what its tool says), answered at `address`.
  // `options.link(request)`, if given, asks the server for an approval's token, so an
  // approval card can offer a link for another device.
  make(call, address, answer, options) {
    if (call.kind === "client") return clientCard(call, address, answer);
    if (call.kind === "approval") return approvalCard(call, address, answer, options);
    if (call.kind === "reconcile") return reconcileCard(call, address, answer);
    if (call.kind === "input") return inputCard(call, address, answer);
    return otherCard(call, address, answer);
  },

  // Shows on the card why the server refused its answer: a result or edit that does not fit
  // beside its fields, a changed request as a sentence.
  refused(box, reply) {
    const body = reply.body || {};
    if (body.code === "stale_approval") {
      note(box, STALE_TEXT);
      return;
    }
    const left = box.schemaForm ? box.schemaForm.place(body.errors) : (body.errors || []);
    const details = left.length ? " — " + left.join("; ") : "";
    const beside = body.code === "invalid_result" && box.schemaForm && left.length < (body.errors || []).length
      ? " (see the marked fields)" : "";
    note(box, "Not accepted (" + body.code + "): " + body.message + beside + details);
  },

  // Moves the focus to the card's first field, unless the person is typing elsewhere.
  focus(box) {
    const active = document.activeElement;
    if (active && active !== document.body && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return;
    const first = box.querySelector("input, select, textarea, button");
    if (first) first.focus();
  },
};
