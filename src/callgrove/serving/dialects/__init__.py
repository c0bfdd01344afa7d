"""The client APIs, one module each behind one interface (`dialect.Dialect`): OpenAI chat
completions (`openai_chat`), OpenAI Responses (`openai_responses`, what Codex speaks) and
Anthropic Messages (`anthropic_messages`, what Claude Code speaks).

Each reads its requests into one `ChatRequest` of renderer messages and writes one `Reply`
back in its own shape, whole or streamed; a server picks the dialect by the route a request
came in on. Answers no route gives (an unknown path, a server fault) take the path's dialect
(`ERROR_HANDLERS`).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from callgrove.serving.dialects.anthropic_messages import ANTHROPIC_MESSAGES
from callgrove.serving.dialects.dialect import Dialect
from callgrove.serving.dialects.openai_chat import OPENAI_CHAT
from callgrove.serving.dialects.openai_responses import OPENAI_RESPONSES
from callgrove.serving.web import HttpError

DIALECTS: tuple[Dialect, ...] = (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC_MESSAGES)
"""Every client API, each with the route it owns (`Dialect.path`)."""


def dialect_of_path(path: str) -> Dialect:
    """The API a request path speaks, for errors no route answers (an unknown path, or one
    below a dialect's route such as `/v1/messages/count_tokens`); OpenAI chat by default."""
    return next((d for d in DIALECTS if d.path in path), OPENAI_CHAT)


async def _unrouted(request: Request, error: Exception) -> Response:
    """No route's answer (an unknown path or method, a server fault) in the path's API shape;
    a fault's traceback still reaches the log, as a server bug's should."""
    if isinstance(error, HTTPException):
        kind = "not_found" if error.status_code == 404 else "invalid_request_error"
        where = f"{request.method} {request.url.path}"
        answer = HttpError(error.status_code, f"{where}: {error.detail}", kind)
    else:
        answer = HttpError(500, f"internal error: {type(error).__name__}: {error}", "server_error")
    return dialect_of_path(request.url.path).error_response(answer)


ERROR_HANDLERS = {HTTPException: _unrouted, Exception: _unrouted}
"""Starlette's exception handlers for both servers: every answer in the client's API shape."""
