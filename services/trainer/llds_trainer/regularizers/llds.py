"""LLDS (``llds_trainer.loss.llds_details``): penalise likelihood decreases of responses with
non-negative advantage, on the actions (or responses, or tokens) whose likelihood fell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from llds_server.settings import ConfigModel

if TYPE_CHECKING:
    from llds_trainer.loss import Gate, LLDSDetails, Normalize
    from llds_trainer.objective import MicroInputs


class Config(ConfigModel):
    """LLDS: penalise likelihood decreases of non-negative-advantage responses (``llds_trainer.loss``)."""

    type: Literal["llds"] = "llds"
    """The LLDS regulariser."""
    coef: float = Field(default=0.2, ge=0)
    """The weight lambda of the LLDS term (0.3 for Qwen2.5-7B-Instruct in the paper)."""
    gate: Literal["action", "response", "token"] = "action"
    """Gate: action (default, best), response, or token (no gate)."""
    normalize: Literal["token", "paper"] = "token"
    """token: sum / loss tokens of the micro-batch (authors' code); paper: per-response mean (Eq. 4)."""
    answer_weight_mode: Literal["off", "fixed", "adaptive_code", "adaptive_paper"] = "off"
    """LLDS-MA answer-span weight: off, fixed, adaptive as in the code, adaptive as in the paper."""
    answer_weight: float = Field(default=0.2, ge=0)
    """w_ans of the MA rules (capped at ``coef``)."""


LLDSConfig = Config


@dataclass(frozen=True)
class LLDSRegularizer:
    lam: float
    gate: Gate
    normalize: Normalize

    def __call__(self, x: MicroInputs, answer_weight: float | None) -> LLDSDetails:
        from llds_trainer.loss import llds_details

        return llds_details(x.logp_new, x.logp_old, x.advantages, x.loss_mask, gate=self.gate, lam=self.lam,
                            answer_mask=x.answer_mask, answer_weight=answer_weight, normalize=self.normalize,
                            keep_mask=x.keep_mask)  # fmt: skip


def build(section: Config, lam: float) -> LLDSRegularizer:
    return LLDSRegularizer(lam=lam, gate=section.gate, normalize=section.normalize)
