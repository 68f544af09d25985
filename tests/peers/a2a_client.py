"""A small A2A client driver built on the official Python A2A SDK (PyPI `a2a-sdk` 1.3).

End-to-end tests use it as a real third-party A2A client of the Hub:

    target/peers/venv/bin/python tests/peers/a2a_client.py < request.json

stdin is ONE JSON object:

    {"agent": "https://127.0.0.1:PORT/a2a/<namespace>/<deployment>",
     "token": "<Hub API token>", "ca_file": "<the Hub's ca.pem>",
     "op": "card" | "send" | "get" | "cancel" | "subscribe" | "list" | "extended_card"
           | "raw_send" | "raw",
     # send:
     "text": "...", "message_id"?: "...", "context_id"?: "...", "task_id"?: "...",
     "stream"?: false, "return_immediately"?: false,
     # get / cancel / subscribe:
     "id": "<task id>",
     # get: "history_length"?: N
     # list (ListTasks; each field optional, as the SDK's ListTasksRequest has it):
     "context_id", "status", "page_size", "page_token", "history_length",
     "status_timestamp_after" (RFC 3339), "include_artifacts",
     # raw_send (a hand-made SendMessage of `size` bytes of text, outside the SDK):
     "size": N,
     # raw (one HTTP request outside the SDK, like curl; the token is sent only with
     # "auth": true): "method": "GET" | "POST", "url": "...", "body"?: "<text>",
     # "headers"?: {...}, "auth"?: false}

It resolves the agent card from `<agent>/.well-known/agent-card.json` with the token, makes a
client with `ClientFactory` (JSON-RPC binding, HTTP/1.1 httpx), runs the one operation and
prints ONE JSON object on stdout (ProtoJSON field names, as the SDK parsed them):

    {"card": {...}}                      card
    {"events": [StreamResponse, ...]}    send (a non-streaming send yields one event), subscribe
                                         (with "announce": true, a line {"attached": true}
                                         comes first, once the stream is open)
    {"task": Task}                       get, cancel
    {"list": ListTasksResponse}          list
    {"card": {...}}                      extended_card (GetExtendedAgentCard)
    {"status": N, "headers": {...},      raw (headers lower-cased; body parsed when JSON, else
     "body": ..., "text": "..."}          null; text as received)
    {"status": 413, "body": ...}         raw_send
    {"error": "<type>: <message>"}       any refusal (the exit code is 0 either way)
"""

import asyncio
import json
import ssl
import sys
import uuid

import httpx
from google.protobuf import json_format

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)


def to_dict(msg):
    return json_format.MessageToDict(msg)


async def run(req):
    ctx = ssl.create_default_context(cafile=req["ca_file"])
    headers = {"Authorization": f"Bearer {req['token']}"}
    if req["op"] == "raw":
        return await raw(req, ctx, headers)
    async with httpx.AsyncClient(verify=ctx, headers=headers, timeout=120) as http:
        op = req["op"]
        if op == "card":
            card = await A2ACardResolver(http, req["agent"]).get_agent_card()
            return {"card": to_dict(card)}
        if op == "raw_send":
            # A SendMessage of `size` bytes of text, posted by hand: HTTP status and body.
            body = {
                "jsonrpc": "2.0",
                "id": "1",
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": str(uuid.uuid4()),
                        "role": "ROLE_USER",
                        "parts": [{"text": "x" * req["size"]}],
                    }
                },
            }
            r = await http.post(req["agent"], json=body)
            try:
                parsed = r.json()
            except ValueError:
                parsed = r.text
            return {"status": r.status_code, "body": parsed}
        factory = ClientFactory(
            ClientConfig(
                httpx_client=http,
                streaming=bool(req.get("stream")) or op == "subscribe",
            )
        )
        client = await factory.create_from_url(req["agent"])
        if op == "send":
            message = Message(
                message_id=req.get("message_id") or str(uuid.uuid4()),
                role=Role.ROLE_USER,
                parts=[Part(text=req["text"])],
            )
            if req.get("context_id"):
                message.context_id = req["context_id"]
            if req.get("task_id"):
                message.task_id = req["task_id"]
            request = SendMessageRequest(message=message)
            if req.get("return_immediately"):
                request.configuration.return_immediately = True
            events = [to_dict(ev) async for ev in client.send_message(request)]
            return {"events": events}
        if op == "get":
            request = GetTaskRequest(id=req["id"])
            if req.get("history_length") is not None:
                request.history_length = req["history_length"]
            return {"task": to_dict(await client.get_task(request))}
        if op == "list":
            request = ListTasksRequest()
            for key in ("context_id", "page_token"):
                if req.get(key):
                    setattr(request, key, req[key])
            for key in ("page_size", "history_length", "include_artifacts"):
                if req.get(key) is not None:
                    setattr(request, key, req[key])
            if req.get("status"):
                request.status = TaskState.Value(req["status"])
            if req.get("status_timestamp_after"):
                request.status_timestamp_after.FromJsonString(req["status_timestamp_after"])
            listed = to_dict(await client.list_tasks(request))
            for key, empty in (("tasks", []), ("nextPageToken", ""), ("pageSize", 0), ("totalSize", 0)):
                listed.setdefault(key, empty)
            return {"list": listed}
        if op == "extended_card":
            card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
            return {"card": to_dict(card)}
        if op == "cancel":
            return {"task": to_dict(await client.cancel_task(CancelTaskRequest(id=req["id"])))}
        if op == "subscribe":
            events = []
            async for ev in client.subscribe(SubscribeToTaskRequest(id=req["id"])):
                if not events and req.get("announce"):
                    # Tells the test the stream is open before the final object.
                    print(json.dumps({"attached": True}), flush=True)
                events.append(to_dict(ev))
            return {"events": events}
        raise ValueError(f"unknown op {op!r}")


async def raw(req, ctx, auth):
    """One HTTP request as given, outside the SDK: status, headers and body."""
    headers = dict(req.get("headers") or {})
    if req.get("auth"):
        headers.update(auth)
    async with httpx.AsyncClient(verify=ctx, timeout=120) as http:
        r = await http.request(
            req.get("method", "POST"),
            req["url"],
            content=req.get("body", "").encode(),
            headers=headers,
        )
    try:
        body = r.json()
    except ValueError:
        body = None
    return {
        "status": r.status_code,
        "headers": {k.lower(): v for k, v in r.headers.items()},
        "body": body,
        "text": r.text,
    }


def main():
    req = json.load(sys.stdin)
    try:
        out = asyncio.run(run(req))
    except Exception as e:  # a refusal is a result the test asserts on
        out = {"error": f"{type(e).__name__}: {e}"}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
