"""Agen for Python: drive an Agen fleet (``Client``, ``AsyncClient``) and run an agent in this
process with Python tools (``Agent``, ``tool``).

Both halves are one native extension built from the Agen workspace: the fleet client is the
``agen`` CLI's own gRPC client code, the embedded agent is the Rust harness ``agen run`` uses.
"""

from . import events
from ._native import __version__
from .embedded import Agent, ApprovalRequest, RunResult, RunStream, Tool, ToolContext, tool
from .errors import (
    AgenError,
    Cancelled,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TaskFailed,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from .fleet import (
    Approval,
    Artifact,
    AsyncClient,
    AsyncTask,
    Client,
    Deployment,
    DoubleTexting,
    Schedule,
    Span,
    Task,
    Trace,
    WebhookDelivery,
)

__all__ = [
    "AgenError",
    "Agent",
    "Approval",
    "ApprovalRequest",
    "Artifact",
    "AsyncClient",
    "AsyncTask",
    "Cancelled",
    "Client",
    "Deployment",
    "DoubleTexting",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "RunResult",
    "RunStream",
    "Schedule",
    "Span",
    "Task",
    "TaskFailed",
    "Tool",
    "ToolContext",
    "Trace",
    "Unauthenticated",
    "Unavailable",
    "WaitTimeout",
    "WebhookDelivery",
    "__version__",
    "events",
    "tool",
]
