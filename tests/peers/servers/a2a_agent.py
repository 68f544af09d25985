"""A remote A2A agent for the a2a delegate tests, served by PyPI a2a-sdk 1.3 (JSON-RPC binding,
plain HTTP on 127.0.0.1).

    python a2a_agent.py --port-file FILE --log FILE --cancel-log FILE --token TOKEN
                        [--sleep SECONDS] [--reply-delay SECONDS]

Binds 127.0.0.1:0 and writes its port to --port-file once it serves. Every request must carry
`Authorization: Bearer TOKEN` (else 401, before a2a-sdk sees it). Each SendMessage it receives
appends one line `<messageId>` to --log (flushed and fsynced), so a test counts sends. The agent
answers `remote says: <input>` as a status message and an artifact `answer.txt` with
`artifact: <input>`; an input containing `FAIL` ends the task TASK_STATE_FAILED, `REJECT`
ends it TASK_STATE_REJECTED; --sleep makes it work that long (state WORKING) before answering;
--reply-delay holds each SendMessage's reply back that long after the task exists (a caller that
dies meanwhile never learns the task id).
"""

import argparse
import asyncio
import json
import os
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from a2a.helpers import new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2 as pb


class Agent(AgentExecutor):
    def __init__(self, sleep: float):
        self.sleep = sleep

    async def execute(self, context: RequestContext, event_queue) -> None:
        text = "".join(p.text for p in context.message.parts if p.HasField("text"))
        if context.current_task is None:
            await event_queue.enqueue_event(
                new_task(context.task_id, context.context_id, pb.TaskState.TASK_STATE_SUBMITTED,
                         history=[context.message])
            )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work(new_text_message("working on it"))
        if self.sleep:
            await asyncio.sleep(self.sleep)
        if "FAIL" in text:
            await updater.failed(new_text_message("the remote agent could not do it"))
            return
        if "REJECT" in text:
            await updater.reject(new_text_message("the remote agent will not do that"))
            return
        await updater.add_artifact([new_text_part(f"artifact: {text}")], name="answer.txt")
        await updater.complete(new_text_message(f"remote says: {text}"))

    async def cancel(self, context: RequestContext, event_queue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


class Gate(BaseHTTPMiddleware):
    """Checks the bearer token and logs each SendMessage's messageId."""

    def __init__(self, app, token: str, log: str, cancel_log: str, reply_delay: float):
        super().__init__(app)
        self.reply_delay = reply_delay
        self.token = token
        self.log = log
        self.cancel_log = cancel_log

    async def dispatch(self, request, call_next):
        if request.url.path.endswith("agent-card.json"):
            return await call_next(request)
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": "bad or missing bearer token"}, status_code=401)
        body = await request.body()
        try:
            msg = json.loads(body)
        except ValueError:
            msg = {}
        method = msg.get("method") if isinstance(msg, dict) else None
        if method in ("SendMessage", "SendStreamingMessage"):
            append(self.log, msg.get("params", {}).get("message", {}).get("messageId", ""))
            response = await call_next(request)
            if self.reply_delay:
                await asyncio.sleep(self.reply_delay)
            return response
        if method == "CancelTask":
            append(self.cancel_log, msg.get("params", {}).get("id", ""))
        return await call_next(request)


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--cancel-log", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--reply-delay", type=float, default=0.0)
    args = ap.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"

    card = pb.AgentCard(
        name="remote-helper",
        description="answers anything, remotely",
        version="1.0.0",
        supported_interfaces=[
            pb.AgentInterface(url=f"{base}/rpc", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=pb.AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[pb.AgentSkill(id="answer", name="answer", description="answers", tags=["test"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Agent(args.sleep), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/rpc")
    app = Starlette(routes=routes)
    app.add_middleware(
        Gate,
        token=args.token,
        log=args.log,
        cancel_log=args.cancel_log,
        reply_delay=args.reply_delay,
    )

    config = uvicorn.Config(app, log_level="warning")
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.02)
        tmp = args.port_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
