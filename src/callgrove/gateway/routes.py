"""The gateway's HTTP routes: the chat APIs, token counting, models, health and close.

Invariant: a route only translates. It checks the key (and, through `attribution`, the
episode), parses the body in its API's shape, hands the call or the close to the `Gateway`,
and answers in the shape the client asked in: every error, whatever raised it, reaches the
client as its API's error object, and nothing here changes an episode but through the
`Gateway` and its `Episodes`.

Every chat route is served at the root (the episode from the key, else `untagged`) and under
`/e/EPISODE/`; the close only under its episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from callgrove.chat import tools_message
from callgrove.episode import encode_episode
from callgrove.gateway.attribution import UNTAGGED, episode_from_key, identify, valid_episode
from callgrove.gateway.core import Gateway
from callgrove.serving.dialects import DIALECTS, ERROR_HANDLERS
from callgrove.serving.dialects.anthropic_messages import ANTHROPIC_MESSAGES, anthropic_messages
from callgrove.serving.dialects.dialect import Dialect
from callgrove.serving.dialects.openai_chat import OPENAI_CHAT
from callgrove.serving.web import (
    HttpError,
    check_headers,
    check_token,
    json_response,
    read_json,
    request_key,
    sse_response,
)


class Routes:
    """The routes of one `Gateway`: `Routes(gateway).app()` serves it."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    def app(self) -> Starlette:
        routes = [Route("/health", self.health, methods=["GET"])]
        for prefix in ("", "/e/{episode}"):
            routes += [
                Route(f"{prefix}{dialect.path}", self._endpoint(dialect), methods=["POST"])
                for dialect in DIALECTS
            ]
            routes += [
                Route(
                    f"{prefix}{ANTHROPIC_MESSAGES.path}/count_tokens",
                    self.count_tokens,
                    methods=["POST"],
                ),
                Route(f"{prefix}/v1/models", self.models, methods=["GET"]),
            ]
        routes.append(Route("/e/{episode}/close", self.close, methods=["POST"]))
        return Starlette(routes=routes, exception_handlers=ERROR_HANDLERS)

    def _attribute(self, request: Request) -> str:
        """The request's episode, after checking its headers and key."""
        check_headers(request)
        path_episode = request.path_params.get("episode")
        key_episode, token = episode_from_key(request_key(request))
        check_token(token, self.gateway.tokens)
        episode = path_episode or key_episode or UNTAGGED
        return valid_episode(episode)

    def _endpoint(self, dialect: Dialect) -> Callable[[Request], Any]:
        gateway = self.gateway

        async def endpoint(request: Request) -> Response:
            with gateway.handling():
                return await answer(request)

        async def answer(request: Request) -> Response:
            stream = False
            try:
                episode = self._attribute(request)
                data = await read_json(request, gateway.body_limit)
                stream = bool(data.get("stream"))
                chat_request = dialect.request(data)
                who = identify(request.headers, chat_request.messages)
                if gateway.streams(chat_request):
                    call_id, events = await gateway.stream_call(dialect, chat_request, episode, who)
                    streamed = sse_response(events)
                    streamed.headers.update(
                        {"x-callgrove-episode": episode, "x-callgrove-call": call_id}
                    )
                    return streamed
                reply = await gateway.call(dialect, chat_request, episode, who)
            except HttpError as error:
                return dialect.error_response(error)
            headers = {
                "x-callgrove-policy-version": str(reply.policy_version),
                "x-callgrove-episode": episode,
                "x-callgrove-call": str(reply.call_id),
            }
            if stream:
                response = sse_response(dialect.reply_events(chat_request, reply))
                response.headers.update(headers)
                return response
            return json_response(dialect.reply(chat_request, reply), headers=headers)

        return endpoint

    async def count_tokens(self, request: Request) -> Response:
        try:
            self._attribute(request)
            data = await read_json(request, self.gateway.body_limit)
            messages = anthropic_messages(data, call=False)
            tools = tools_message(data.get("tools") or [])
            count = len(self.gateway.chat.render(([tools] if tools else []) + messages))
        except HttpError as error:
            return ANTHROPIC_MESSAGES.error_response(error)
        return json_response({"input_tokens": count})

    async def models(self, request: Request) -> Response:
        try:
            self._attribute(request)
        except HttpError as error:
            return OPENAI_CHAT.error_response(error)
        return json_response(
            {
                "object": "list",
                "data": [{"id": "policy", "object": "model", "owned_by": "callgrove"}],
            }
        )

    async def close(self, request: Request) -> Response:
        try:
            check_headers(request)
            episode = valid_episode(request.path_params["episode"])
            key_episode, token = episode_from_key(request_key(request))
            check_token(token, self.gateway.tokens)
            if key_episode not in (None, episode):
                raise HttpError(403, f"the key names episode {key_episode!r}, not {episode!r}")
            body = await read_json(request, self.gateway.body_limit, empty_ok=True)
            record = await self.gateway.episodes.close(episode, body)
        except HttpError as error:
            return OPENAI_CHAT.error_response(error)
        return Response(encode_episode(record), media_type="application/json")

    async def health(self, request: Request) -> Response:
        """Liveness; the counts only to a client with a key (when keys are required)."""
        try:
            check_token(episode_from_key(request_key(request))[1], self.gateway.tokens)
        except HttpError:
            return json_response({"ok": True})
        episodes = self.gateway.episodes
        return json_response(
            {"ok": True, "episodes": len(episodes.open), "quarantined": len(episodes.quarantined)}
        )
