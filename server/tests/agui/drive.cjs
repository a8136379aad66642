// Drives one thread with the official AG-UI client (@ag-ui/client's HttpAgent): a run that
// ends with an interrupt, then a run whose resume answers every interrupt with what
// ANSWERS (a JSON object: tool name → resume payload) gives for its call's tool. Prints one
// JSON line: both runs' outcomes and the events each delivered, as the client saw them.
// `node drive.cjs URL API_KEY THREAD AGENT MESSAGE ANSWERS`; NODE_PATH names the
// node_modules that holds @ag-ui/client (.ci/run installs it).
"use strict";
const { HttpAgent, buildResumeArray } = require("@ag-ui/client");

async function main() {
  const [url, key, threadId, agentName, message, answersJson] = process.argv.slice(2);
  const answers = JSON.parse(answersJson);
  const agent = new HttpAgent({
    url,
    headers: { "x-api-key": key },
    threadId,
    initialMessages: [{ id: "m1", role: "user", content: message }],
  });
  const runs = [];
  const run = async (parameters) => {
    const seen = { types: [], finished: null, error: null };
    const subscriber = {
      onEvent: ({ event }) => {
        seen.types.push(event.type);
      },
      onRunFinishedEvent: ({ event }) => {
        seen.finished = event;
      },
      onRunErrorEvent: ({ event }) => {
        seen.error = event;
      },
    };
    await agent.runAgent(parameters, subscriber);
    runs.push(seen);
    return seen;
  };
  const first = await run({ runId: "run-1", forwardedProps: { dormant: { agent: agentName } } });
  const interrupts = (first.finished && first.finished.outcome && first.finished.outcome.interrupts) || [];
  const responses = {};
  for (const interrupt of interrupts) {
    const tool = interrupt.metadata && interrupt.metadata.tool_name;
    responses[interrupt.id] = { status: "resolved", payload: answers[tool] };
  }
  await run({ runId: "run-2", resume: buildResumeArray(interrupts, responses) });
  console.log(JSON.stringify({ runs, messages: agent.messages.length }));
}

main().catch((error) => {
  console.error(error && error.stack ? error.stack : String(error));
  process.exit(1);
});
