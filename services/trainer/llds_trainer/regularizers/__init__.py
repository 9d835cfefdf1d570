"""Likelihood regularisers, one module each, found by :func:`pkgutil.iter_modules`.

A variant is a module of this package that defines ``Config`` (a :class:`llds_server.settings.ConfigModel`
whose ``type`` literal names it; a ``coef`` field is its weight lambda) and ``build(section, lam)``
returning a :class:`Regularizer`. Adding one is that module and its test: the ``[regularizer]``
section's union (:data:`RegularizerConfig`), its flags (``--regularizer.type``), the presets and the
step pick it up from here. A module in another ``llds_trainer/regularizers`` folder on ``sys.path``
(a plugin of one's own, outside this tree) is a variant too.

Importing this package loads no torch: a variant imports its tensor code inside ``build`` or its call.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from llds_server.settings import type_values, typed_union

if TYPE_CHECKING:
    from llds_trainer.loss import LLDSDetails
    from llds_trainer.objective import MicroInputs

# Other llds_trainer/regularizers folders on sys.path add their modules (after this one's).
_here = {os.path.realpath(p) for p in __path__}
for _entry in sys.path:
    _dir = os.path.join(_entry or ".", "llds_trainer", "regularizers")
    if os.path.isdir(_dir) and os.path.realpath(_dir) not in _here:
        __path__.append(_dir)
        _here.add(os.path.realpath(_dir))

DEFAULT = "llds"
"""The variant of a ``[regularizer]`` section without ``type`` (and of a config without the section)."""


class Regularizer(Protocol):
    """A likelihood regulariser added to the policy loss: it gets the micro-batch (its full loss mask,
    and the correction's keep mask in ``x.keep_mask``) and the step's answer-span weight."""

    def __call__(self, x: MicroInputs, answer_weight: float | None) -> LLDSDetails | None: ...


class NoRegularizer:
    """No term (plain GRPO, or an alarm that has not switched a regulariser on yet)."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _discover() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if not (hasattr(module, "Config") and callable(getattr(module, "build", None))):
            raise TypeError(f"{module.__name__}: a regulariser module defines Config and build(section, lam)")
        for t in type_values(module.Config):
            if t in found:
                raise TypeError(
                    f"regulariser type {t!r} is declared by {found[t].__name__} and {module.__name__}"
                )
            found[t] = module
    if DEFAULT not in found:
        raise TypeError(f"no regulariser module declares the default type {DEFAULT!r}")
    return found


VARIANTS: dict[str, ModuleType] = _discover()
"""``[regularizer] type`` -> its module."""

# The default variant first (typed_union's default), each Config once (a module may declare several types).
RegularizerConfig: Any = typed_union(
    *dict.fromkeys([VARIANTS[DEFAULT].Config, *(m.Config for m in VARIANTS.values())])
)
"""The ``[regularizer]`` section: one of the variants' ``Config``, picked by ``type``."""


def build(section: Any, lam: float | None) -> Regularizer:
    """The regulariser of ``section`` with weight ``lam``; none when ``lam`` is ``None`` (no regulariser
    configured, or an acting alarm that has not switched one on)."""
    if lam is None:
        return NoRegularizer()
    built: Regularizer = VARIANTS[section.type].build(section, lam)
    return built


def weight(section: Any) -> float | None:
    """The configured lambda of ``section`` (its ``coef``), ``None`` for a variant without one."""
    coef = getattr(section, "coef", None)
    return None if coef is None else float(coef)
