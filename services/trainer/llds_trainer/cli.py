"""``llds trainer run``: the GRPO + LLDS trainer service.

Consumes trajectory groups from Redis, trains, publishes weights and serves ``/health``,
``/metrics``, ``/history``, ``/status`` while it trains. Example::

    python -m llds_trainer --config configs/trainer_cpu.toml --model DIR --redis-url redis://127.0.0.1:6379/0 \\
        --run-dir runs/trainer --weights-root runs/weights --steps 100

Data-parallel: ``torchrun --nproc_per_node 2 -m llds_trainer --config ...`` (rank 0 serves HTTP).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from pydantic import ValidationError

from llds_proto.exits import EXIT_BAD_CONFIG, EXIT_FAILED, EXIT_NO_SIGNAL
from llds_server.cli import add_settings_flags, settings_overrides
from llds_server.settings import ConfigError, check_not_placeholder
from llds_trainer.config import ADMIN_TOKEN_ENV, TrainerConfig

log = logging.getLogger("llds.trainer")


def build_parser() -> argparse.ArgumentParser:
    """``llds trainer run``'s flags: one per :class:`TrainerConfig` field, plus ``--config`` and ``--set``."""
    p = argparse.ArgumentParser(prog="llds trainer run", description=__doc__.split("\n\n")[0])
    add_settings_flags(
        p,
        TrainerConfig,
        aliases={"notify_urls": ["--notify-url"]},
        config_help="TOML file (e.g. configs/trainer_cpu.toml)",
    )
    return p


def load_config(argv: list[str]) -> TrainerConfig:
    args = build_parser().parse_args(argv)
    return TrainerConfig.load(args.config, settings_overrides(args, TrainerConfig))


def run_main(argv: list[str]) -> int:
    """Parse and validate the config, then (importing torch only now) train and serve."""
    token = os.environ.get(ADMIN_TOKEN_ENV) or None
    try:
        cfg = load_config(argv)
        check_not_placeholder(ADMIN_TOKEN_ENV, token)
    except (ConfigError, ValidationError) as e:
        print(f"llds trainer: bad config: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if not cfg.model:
        print("llds trainer: --model is required", file=sys.stderr)
        return EXIT_BAD_CONFIG
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s %(name)s[r{rank}] %(message)s",
        stream=sys.stderr,
    )
    if rank == 0:
        path = cfg.write_toml(os.path.join(cfg.run_dir, "trainer_config.toml"))
        log.info("resolved config written to %s", path)
    if token is None:
        log.warning("%s is not set: weight-update notices will be rejected by the rollout", ADMIN_TOKEN_ENV)

    from llds_server.http import BackgroundServer
    from llds_trainer.app import create_app
    from llds_trainer.core import NoLearningSignal
    from llds_trainer.service import TrainerService

    service = TrainerService(cfg, admin_token=token)
    server = None
    if rank == 0:
        try:
            server = BackgroundServer(create_app(service), host=cfg.host, port=cfg.port).start()
        except RuntimeError:
            print(f"llds trainer: cannot serve HTTP on {cfg.host}:{cfg.port} (port in use?)", file=sys.stderr)
            return EXIT_FAILED

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after the current step", signum)
        service.stop_event.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    rc = 0
    try:
        service.setup()
        service.run()
        log.info("trainer %s at step %d", service.state, service.trainer.state.step)
    except Exception as e:
        service.state = "failed"
        service.error = f"{type(e).__name__}: {e}"
        if isinstance(e, NoLearningSignal):  # the policy's failure, not the code's: no traceback
            log.error("trainer stopped: %s", e)
            rc = EXIT_NO_SIGNAL
        else:
            log.exception("trainer failed")
            rc = EXIT_FAILED
    finally:
        service.close_writers()
        if server is not None:
            server.stop()
        if service.trainer is not None:
            service.trainer.dist.close()
    return rc


def main() -> int:
    return run_main(sys.argv[1:])
