"""Drives dormant's A2A server with the official A2A SDK (a2a-sdk) as a client.

`python drive.py start BASE` sends a first message and prints the task and the session token;
`python drive.py answer BASE TOKEN TASK_ID` reads the task again (after a restart of dormant,
say), answers the client tool it waits on, sends the same answer again (a duplicate), approves
the gated tool, and prints what each step gave; `python drive.py cancel BASE` starts a task and
cancels it; `python drive.py stream BASE` walks a task over SendStreamingMessage and then
subscribes to it once it is over. One JSON object on stdout each.
"""

import asyncio
import json
import sys

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
)
from google.protobuf import json_format, struct_pb2


def as_dict(message):
    return json_format.MessageToDict(message)


def data_part(value):
    data = struct_pb2.Value()
    json_format.ParseDict(value, data)
    return Part(data=data)


async def send(client, message):
    """The task a blocking SendMessage answered."""
    events = [event async for event in client.send_message(SendMessageRequest(message=message))]
    return events[-1].task


async def connect(base, token=None, streaming=False):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=30)
    client = await create_client(base, ClientConfig(httpx_client=http, streaming=streaming))
    return http, client


async def stream(base):
    """The same walk over SendStreamingMessage: what each message's stream delivered."""
    out = {}
    http, client = await connect(base, streaming=True)
    try:
        message = Message(message_id="s1", role=Role.ROLE_USER, parts=[Part(text="weather in Lisbon")])
        events = [as_dict(event) async for event in client.send_message(SendMessageRequest(message=message))]
    finally:
        await http.aclose()
    out["started"] = events
    task = events[0]["task"]
    token = task.get("metadata", {}).get("dormant_session_token")
    http, client = await connect(base, token, streaming=True)
    try:
        for name, answer in [
            ("answered", {"tool_call_id": "ask_user-1", "result": {"answer": "Lisbon by the river"}}),
            ("approved", {"tool_call_id": "publish-1", "approved": True}),
        ]:
            reply = Message(message_id=name, role=Role.ROLE_USER, task_id=task["id"],
                            context_id=task["contextId"], parts=[data_part(answer)])
            out[name] = [as_dict(event) async for event in client.send_message(SendMessageRequest(message=reply))]
        try:
            out["subscribed"] = [as_dict(event) async for event in client.subscribe(SubscribeToTaskRequest(id=task["id"]))]
        except Exception as error:  # the SDK's typed JSON-RPC error
            out["subscribe_error"] = f"{type(error).__name__}: {error}"
    finally:
        await http.aclose()
    print(json.dumps(out))


async def start(base):
    http, client = await connect(base)
    try:
        message = Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text="weather in Porto")])
        task = await send(client, message)
        out = as_dict(task)
        print(json.dumps({"task": out, "token": out.get("metadata", {}).get("dormant_session_token")}))
    finally:
        await http.aclose()


async def answer(base, token, task_id):
    http, client = await connect(base, token)
    try:
        out = {"read": as_dict(await client.get_task(GetTaskRequest(id=task_id)))}
        context = out["read"]["contextId"]
        reply = Message(
            message_id="m2",
            role=Role.ROLE_USER,
            task_id=task_id,
            context_id=context,
            parts=[data_part({"tool_call_id": "ask_user-1", "result": {"answer": "Porto in the sun"}})],
        )
        out["answered"] = as_dict(await send(client, reply))
        try:
            again = Message(message_id="m3", role=Role.ROLE_USER, task_id=task_id, context_id=context,
                            parts=[data_part({"tool_call_id": "ask_user-1", "result": {"answer": "again"}})])
            out["duplicate"] = as_dict(await send(client, again))
        except Exception as error:  # the SDK's typed JSON-RPC error
            out["duplicate_error"] = f"{type(error).__name__}: {error}" 
        approve = Message(
            message_id="m4",
            role=Role.ROLE_USER,
            task_id=task_id,
            context_id=context,
            parts=[data_part({"tool_call_id": "publish-1", "approved": True})],
        )
        out["approved"] = as_dict(await send(client, approve))
        print(json.dumps(out))
    finally:
        await http.aclose()


async def cancel(base):
    http, client = await connect(base)
    try:
        message = Message(message_id="c1", role=Role.ROLE_USER, parts=[Part(text="weather in Faro")])
        task = await send(client, message)
        token = as_dict(task).get("metadata", {}).get("dormant_session_token")
    finally:
        await http.aclose()
    http, client = await connect(base, token)
    try:
        out = {"task": as_dict(task)}

        async def refused(name, call):
            try:
                await call
                out[name] = "accepted"
            except Exception as error:  # the SDK's typed JSON-RPC error
                out[name] = type(error).__name__

        # A new task in the context while this one waits would abandon it: refused.
        other = Message(message_id="c2", role=Role.ROLE_USER, context_id=task.context_id,
                        parts=[Part(text="something else")])
        await refused("new_task_while_waiting", send(client, other))
        out["cancelled"] = as_dict(await client.cancel_task(CancelTaskRequest(id=task.id)))
        await refused("cancel_again", client.cancel_task(CancelTaskRequest(id=task.id)))
        print(json.dumps(out))
    finally:
        await http.aclose()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    asyncio.run({"start": start, "answer": answer, "cancel": cancel, "stream": stream}[command](*args))
