// An approval handed to a person's device as a link (`#approval=TOKEN`): the page shows only
// that approval — what the tool does, its arguments, an edit when the tool allows one — and
// decides it with the token as the only credential (`GET /approval`, `POST /approval`). A
// conversation's or the inbox's approval card makes such a link ("Link for another device").
"use strict";

const APPROVAL_HASH = "#approval=";

// The link that opens this page on an approval's token.
function deviceLink(token) {
  return location.origin + location.pathname + APPROVAL_HASH + encodeURIComponent(token);
}

// Asks for a token of the approval at `address` (with `ask`: the view's way to reach the
// server) and shows the link on the card.
async function offerDeviceLink(box, address, ask) {
  const reply = await ask({
    session_id: address.session_id,
    tool_call_id: address.tool_call_id,
    owner_session_id: address.owner_session_id,
  });
  if (!reply.ok) {
    note(box, "No link (" + reply.body.code + "): " + reply.body.message);
    return;
  }
  let field = box.querySelector("input.device-link");
  if (!field) {
    field = document.createElement("input");
    field.type = "text";
    field.readOnly = true;
    field.className = "device-link";
    field.setAttribute("aria-label", "Link that approves or denies this call on another device");
    box.querySelector(".actions").after(field);
  }
  field.value = deviceLink(reply.body.token);
  field.select();
  note(box, "Anyone with this link can approve or deny this call, once, until " +
    new Date(reply.body.expires_at_ms).toLocaleString() + ".");
}

// The device view: the approval the token names, decided here.
async function showDeviceApproval(token) {
  for (const hidden of ["#conversation-view", "#inbox-view", "nav.views", "#new"]) {
    $(hidden).hidden = true;
  }
  const view = $("#device-view");
  view.hidden = false;
  const status = $("#device-status");
  const shown = await call("GET", "approval?token=" + encodeURIComponent(token), undefined, null);
  if (!shown.ok) {
    status.textContent = "This link does not open an approval (" + shown.body.code + "): " +
      shown.body.message;
    return;
  }
  const approval = shown.body;
  if (!approval.waiting) {
    status.textContent = "This approval was already decided, or its time ran out.";
    return;
  }
  status.textContent = "Waiting for your decision, until " +
    new Date(approval.deadline_at_ms).toLocaleString() + ".";
  const callShown = {
    session_id: approval.session_id, tool_call_id: approval.tool_call_id,
    tool_name: approval.tool_name, kind: "approval", input: approval.input,
    description: approval.description, input_schema: approval.input_schema,
    editable: approval.editable,
  };
  const decide = async (box, envelope) => {
    controls(box, false);
    const decision = { token, approved: envelope.approved };
    if (envelope.reason) decision.reason = envelope.reason;
    if (envelope.edited_input !== undefined) decision.edited_input = envelope.edited_input;
    const reply = await call("POST", "approval", decision, null);
    if (reply.ok) {
      settle(box, envelope.approved ? "Approved. You may close this page." : "Denied. You may close this page.");
    } else if (reply.body.code === "already_completed") {
      settle(box, "Already decided (or its time ran out): your decision was not applied.");
    } else if (reply.body.code === "stale_approval") {
      // The link names the request as it was: a new one is needed for the call as it is.
      settle(box, "This request changed since the link was made (its input or its tool " +
        "changed), so your decision was not applied: ask for a new link.");
    } else {
      controls(box, true);
      Cards.refused(box, reply);
    }
  };
  const box = Cards.make(callShown, {}, decide);
  view.appendChild(box);
  Cards.focus(box);
}

if (location.hash.startsWith(APPROVAL_HASH)) {
  showDeviceApproval(decodeURIComponent(location.hash.slice(APPROVAL_HASH.length)));
}
