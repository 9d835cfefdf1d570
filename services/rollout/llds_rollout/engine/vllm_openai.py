"""vLLM's OpenAI-compatible ``/v1`` routes, served by the rollout service on the same engine.

vLLM builds its own FastAPI app (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
``/v1/responses``, ...) around an engine client. We build that app around our ``AsyncLLM``, keep
only its ``/v1/`` routes (vLLM's dev and admin endpoints, ``/pause``, ``/collective_rpc``,
``/reset_prefix_cache`` and the like, are never reachable through us), and run it on the engine's
own event loop: the ASGI ``receive``/``send`` of each request are bridged from the service's loop,
so vLLM's handlers, its output processing and the engine all live on the one loop that owns them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/v1/"
CONTROL = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
"""Control routes vLLM puts under ``/v1/`` (only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); never served."""


def keeps(path: str) -> bool:
    """Whether a vLLM route is served: the OpenAI-compatible ``/v1/`` inference surface only."""
    return path.startswith(PREFIX) and path not in CONTROL


async def build_openai_app(llm: Any, model: str, served_name: str) -> ASGIApp:
    """vLLM's OpenAI-compatible app around ``llm`` (call on the engine's loop), ``/v1/`` routes only."""
    import os

    from starlette.middleware.cors import CORSMiddleware
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
        # Dev mode adds unauthenticated control routes; they are filtered below, but a process
        # configured that way is a mistake worth stopping on.
        raise RuntimeError("VLLM_SERVER_DEV_MODE is set: unset it for the rollout service")
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--model", model, "--served-model-name", served_name or model, "--disable-fastapi-docs"]
    )
    tasks = tuple(await llm.get_supported_tasks())
    app = build_app(args, tasks, llm.model_config)
    await init_app_state(llm, app.state, args, tasks)
    app.router.routes[:] = [r for r in app.router.routes if keeps(getattr(r, "path", ""))]
    # vLLM allows every origin by default: any web page in a browser on the host could use the
    # model (and starve training). No CORS headers at all: browsers then refuse cross-origin calls.
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not CORSMiddleware]
    return app


async def call_on_loop(
    app: ASGIApp, loop: asyncio.AbstractEventLoop, scope: Scope, receive: Receive, send: Send
) -> None:
    """Run ``app`` for one request on ``loop``, with ``receive``/``send`` bridged back to this loop.

    Cancelling the caller (client gone, server shutting down) cancels the request on ``loop``.
    """
    here = asyncio.get_running_loop()

    async def bridged_receive() -> Message:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(receive(), here))

    async def bridged_send(message: Message) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(send(message), here))

    fut = asyncio.run_coroutine_threadsafe(app(scope, bridged_receive, bridged_send), loop)
    try:
        await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        fut.cancel()
        raise
