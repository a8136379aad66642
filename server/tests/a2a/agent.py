"""An A2A 1.0 agent built with the official SDK (a2a-sdk's server side, on uvicorn), which
dormant's A2A client delegates to in `tests/a2a_client.rs`.

`python agent.py LOG` serves on a free port of 127.0.0.1 and prints `listening PORT` once it
listens. A first message starts a task that asks
for input ("Which account should the refund go to?", TASK_STATE_INPUT_REQUIRED); the follow-up
message completes it with the artifact "refunded to ACCOUNT". A first message that says "auth"
asks for credentials instead (TASK_STATE_AUTH_REQUIRED). Each task started, each answer taken
and each cancel is one line of LOG (JSON), so the test can count them: a task started twice,
or an answer applied twice, shows there. A start's line has the request's W3C `traceparent`.
"""

import json
import socket
import sys

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from starlette.applications import Starlette

LOG = sys.argv[1]
# Bound before the card is made (it names the port), listened on before the line is printed.
SOCKET = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
SOCKET.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
SOCKET.bind(("127.0.0.1", 0))
SOCKET.listen(128)
PORT = SOCKET.getsockname()[1]


def log(event, **fields):
    with open(LOG, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, **fields}) + "\n")


class Refunds(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue):
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        said = context.get_user_input()
        if context.current_task is None:
            headers = context.call_context.state.get("headers", {})
            log(
                "started",
                task=context.task_id,
                context=context.context_id,
                said=said,
                traceparent=headers.get("traceparent"),
            )
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
            await updater.start_work()
            if "auth" in said:
                ask = "Sign in to the billing system first."
                await updater.requires_auth(
                    updater.new_agent_message([Part(text=ask)])
                )
                return
            ask = "Which account should the refund go to?"
            await updater.requires_input(updater.new_agent_message([Part(text=ask)]))
            return
        log("answered", task=context.task_id, said=said)
        await updater.start_work()
        await updater.add_artifact([Part(text=f"refunded to {said}")], name="refund")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue):
        log("canceled", task=context.task_id)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


card = AgentCard(
    name="refunds",
    description="Refunds a payment once told the account.",
    version="1.0.0",
    supported_interfaces=[
        AgentInterface(
            url=f"http://127.0.0.1:{PORT}/",
            protocol_binding="JSONRPC",
            protocol_version="1.0",
        )
    ],
    capabilities=AgentCapabilities(streaming=False),
    skills=[
        AgentSkill(
            id="refund",
            name="Refund",
            description="Refunds a payment to the account it is told.",
            tags=["billing"],
        )
    ],
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
)
handler = DefaultRequestHandler(
    agent_executor=Refunds(), task_store=InMemoryTaskStore(), agent_card=card
)
app = Starlette(
    routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/")
)

if __name__ == "__main__":
    print(f"listening {PORT}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[SOCKET])
