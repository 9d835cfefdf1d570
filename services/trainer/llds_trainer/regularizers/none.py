"""No likelihood regulariser: plain GRPO."""

from __future__ import annotations

from typing import Any, Literal

from llds_server.settings import ConfigModel


class Config(ConfigModel):
    """No likelihood regulariser (plain GRPO)."""

    type: Literal["none"] = "none"
    """No regulariser."""


def build(section: Config, lam: float) -> Any:
    from llds_trainer.regularizers import NoRegularizer

    return NoRegularizer()
