"""Entrypoints: ``llds rollout serve`` (:func:`serve_main`) and ``llds answer`` (:func:`answer_main`).

    llds rollout serve --config configs/rollout_cpu.toml --model DIR --dataset train.jsonl \\
        --weights-root runs/x/weights --retriever-url http://127.0.0.1:8000
    llds answer --rollout-url http://127.0.0.1:8001 "who wrote hamlet"
    llds answer --model DIR --retriever-url http://127.0.0.1:8000 "who wrote hamlet"

Config is parsed and validated before torch is imported, so ``--help`` and bad configs are instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from pydantic import ValidationError

from llds_rollout.config import RolloutSettings
from llds_server.cli import add_settings_flags, settings_overrides
from llds_server.settings import ConfigError

ENGINE_ALIAS = {"engine.type": ["--engine"]}
"""``--engine vllm``, the old spelling of ``--engine.type vllm``."""
ANSWER_OWN = ("train", "max_turns")
"""Fields ``llds answer`` gives no flag: it never trains, and its ``--max-turns`` is the request's."""


def serve_parser() -> argparse.ArgumentParser:
    """``llds rollout serve``'s flags: one per :class:`RolloutSettings` field, ``--config``, ``--set``
    and ``--write-config``."""
    p = argparse.ArgumentParser(prog="llds rollout serve", description="Serve the rollout service.")
    add_settings_flags(
        p, RolloutSettings, aliases=ENGINE_ALIAS, config_help="TOML config (e.g. configs/rollout_cpu.toml)"
    )
    p.add_argument("--write-config", help="write the resolved config (secrets masked) to this TOML file")
    return p


def load_settings(args: argparse.Namespace, exclude: tuple[str, ...] = (), **fixed: Any) -> RolloutSettings:
    """The settings from parsed ``args`` (defaults < ``--config`` < env < flags < ``fixed``)."""
    overrides = {**settings_overrides(args, RolloutSettings, exclude=exclude), **fixed}
    return RolloutSettings.load(args.config, overrides)


def _config_error(e: Exception) -> int:
    print(f"error: invalid rollout config: {e}", file=sys.stderr)
    return 2


def serve_main(argv: list[str]) -> int:
    """``llds rollout serve``: run the rollout service until interrupted."""
    args = serve_parser().parse_args(argv)
    try:
        settings = load_settings(args)
    except (ConfigError, ValidationError) as e:
        return _config_error(e)
    if not settings.model:
        return _config_error(ValueError("no model: pass --model or set model in the config"))
    if args.write_config:
        settings.write_toml(args.write_config)
    configure_logging()

    import uvicorn

    from llds_rollout.app import create_app
    from llds_server.http import uvicorn_config
    from llds_server.logs import uvicorn_log_config

    app = create_app(settings)
    uvicorn.Server(
        uvicorn_config(app, settings.host, settings.port, log_level="info", log_config=uvicorn_log_config())
    ).run()
    return 0


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
OWN_LOGGERS = ("llds_rollout", "llds_proto")


def configure_logging(level: int = logging.INFO) -> None:
    """Our loggers get a handler of their own and do not propagate to the root logger.

    The root logger is not ours to keep: a dependency of vLLM (``model_hosting_container_standards``)
    sets its level, and its handlers' levels, to ERROR when the engine starts, which silenced every
    INFO and WARNING line of the rollout on the vLLM engine. Third-party lines still go through root.
    """
    logging.basicConfig(level=level, format=LOG_FORMAT)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    for name in OWN_LOGGERS:
        own = logging.getLogger(name)
        own.handlers = [handler]
        own.setLevel(level)
        own.propagate = False


def answer_parser() -> argparse.ArgumentParser:
    """``llds answer``'s flags: its own, and for an in-process answer one per :class:`RolloutSettings`
    field (but ``train`` and ``max_turns``)."""
    p = argparse.ArgumentParser(
        prog="llds answer",
        description="Answer a question with the search agent.",
        usage="%(prog)s [-h] [--rollout-url URL | --model M ...] [--max-turns N] [--json] question",
    )
    p.add_argument("question", help="the question")
    p.add_argument("--rollout-url", help="a running rollout service (else the model runs in-process)")
    p.add_argument(
        "--max-turns", type=int, dest="request_max_turns", help="search-enabled turns of this answer"
    )
    p.add_argument("--json", action="store_true", help="print the full AnswerResponse as JSON")
    add_settings_flags(
        p, RolloutSettings, exclude=ANSWER_OWN, aliases=ENGINE_ALIAS, config_help="TOML config (in-process)"
    )
    return p


def answer_main(argv: list[str]) -> int:
    """``llds answer``: answer one question through a running service or in-process."""
    args = answer_parser().parse_args(argv)
    if not args.question.strip():
        print("error: the question is blank", file=sys.stderr)
        return 2
    if args.rollout_url:
        data = _answer_remote(args.rollout_url, args.question, args.request_max_turns)
        if data is None:
            return 1
    else:
        try:
            settings = load_settings(args, exclude=ANSWER_OWN, train=False)
        except (ConfigError, ValidationError) as e:
            return _config_error(e)
        if not settings.model:
            return _config_error(ValueError("pass --rollout-url, or --model (and --retriever-url)"))
        import asyncio

        try:
            data = asyncio.run(_answer_local(settings, args.question, args.request_max_turns))
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        for i, t in enumerate(data["turns"], start=1):
            print(f"--- turn {i}\n{t['text']}")
            if t.get("search_query"):
                print(f"[searched {t['search_query']!r}: {len(t['documents'])} documents]")
        print(f"\nanswer: {data['answer']}  (weights v{data['weights_version']}, {data['latency_s']:.1f} s)")
    return 0


def _answer_remote(url: str, question: str, max_turns: int | None) -> dict[str, Any] | None:
    import httpx

    body: dict[str, Any] = {"question": question}
    if max_turns is not None:
        body["max_turns"] = max_turns
    try:
        resp = httpx.post(f"{url.rstrip('/')}/answer", json=body, timeout=600)
    except httpx.HTTPError as e:
        print(f"error: cannot reach {url}: {e}", file=sys.stderr)
        return None
    if resp.status_code != 200:
        print(f"error: HTTP {resp.status_code}: {resp.text}", file=sys.stderr)
        return None
    return resp.json()


async def _answer_local(settings: RolloutSettings, question: str, max_turns: int | None) -> dict[str, Any]:
    from llds_proto.messages import AnswerRequest
    from llds_rollout.service import RolloutService

    service = RolloutService(settings)
    await service.start()
    try:
        if service.load_error:
            raise RuntimeError(f"model failed to load: {service.load_error}")
        resp = await service.answer(AnswerRequest(question=question, max_turns=max_turns))
        return resp.model_dump(mode="json")
    finally:
        await service.stop()
