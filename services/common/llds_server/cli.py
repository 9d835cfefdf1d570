"""Command-line flags derived from a settings class, so no command writes its flags by hand.

:func:`add_settings_flags` gives every field of a :class:`~llds_server.settings.ServiceSettings`
subclass one flag, ``--field-name``, whose help is the field's docstring and default; fields of a
nested model get dotted flags (``--engine.type vllm``). :func:`settings_overrides` turns the parsed
arguments back into the overrides dict of :meth:`ServiceSettings.load`, holding only the flags
actually given, so an unset flag never hides a TOML or environment value.

Mapping of field types to flags:

- ``bool``: ``--x`` / ``--no-x``;
- ``Literal[...]``: ``choices``;
- ``int``, ``float``, ``str``, ``Path``: that ``type``; ``X | None`` takes an ``X``;
- ``list[X]`` (X one of the above): repeatable, the flags given replace the configured list;
- ``tuple[X, X, ...]``: as many values after one flag;
- a pydantic model: one dotted flag per field of it;
- a ``typed_union`` section: ``--section.type`` choosing among its variants, and one dotted flag per
  field of any variant (a field the chosen variant lacks is refused when the settings validate);
- anything else, and secrets (``admin_token``): no flag.

Every field, with a flag or not, is also reachable with ``--set KEY=VALUE`` (VALUE in TOML syntax,
a bare word is a string; ``--set engine.max_batch_size=8`` for nested fields), besides TOML and env.
"""

from __future__ import annotations

import argparse
import tomllib
import types
import typing
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import tomli_w
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from llds_server.settings import is_secret_key, type_values, union_variants

SET_DEST = "settings_set"
"""Dest of ``--set`` (a list of (dotted key, value) pairs)."""

_SCALARS: dict[type, Any] = {int: int, float: float, str: str, Path: Path}


@dataclass(frozen=True)
class Flag:
    """One derived flag: the field it sets (``path``) and what ``add_argument`` gets."""

    path: tuple[str, ...]
    """Field names from the settings class down to the field (``("engine", "type")``)."""
    option: str
    """``--field-name`` (``--engine.type`` for a nested field)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """``add_argument`` keyword arguments except ``dest`` and ``help``."""
    help: str = ""
    group: str | None = None
    """Title of the argument group (the nested model's field name), None for a top-level field."""
    group_help: str | None = None

    @property
    def dest(self) -> str:
        return ".".join(self.path)


def _unwrap_optional(tp: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged (a union of two real types stays a union)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _scalar_kwargs(tp: Any) -> dict[str, Any] | None:
    """``type``/``choices`` of one value of type ``tp``, or None when it cannot be given as a flag."""
    tp = _unwrap_optional(tp)
    if typing.get_origin(tp) is Literal:
        values = typing.get_args(tp)
        kinds = {type(v) for v in values}
        if len(kinds) != 1 or next(iter(kinds)) not in (str, int):
            return None
        return {"type": next(iter(kinds)), "choices": list(values)}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    return None


def _field_kwargs(tp: Any) -> dict[str, Any] | None:
    """``add_argument`` keyword arguments of a field of type ``tp``; None: no flag for it."""
    tp = _unwrap_optional(tp)
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp) or (None,)
        one = _scalar_kwargs(inner) if inner is not bool else None
        return None if one is None else {"action": "append", **one}
    if origin is tuple:
        args = typing.get_args(tp)
        if not args or Ellipsis in args or len(set(args)) != 1:
            return None
        one = _scalar_kwargs(args[0]) if args[0] is not bool else None
        return None if one is None else {"nargs": len(args), **one}
    return _scalar_kwargs(tp)


def _default_text(info: FieldInfo) -> str:
    default = info.get_default(call_default_factory=True)
    if default is None or default is PydanticUndefined:
        return "unset"
    try:
        return tomli_w.dumps({"v": to_jsonable_python(default)}).strip()[len("v = ") :]
    except (TypeError, ValueError):
        return str(default)


def _description(info: FieldInfo) -> str:
    """The field's docstring on one line, ``%`` escaped for argparse."""
    return " ".join((info.description or "").split()).replace("%", "%%")


def _help(info: FieldInfo) -> str:
    default = f"(default: {_default_text(info)})".replace("%", "%%")
    return f"{_description(info)} {default}".lstrip()


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def settings_flags(
    settings_cls: type[BaseModel], *, exclude: Collection[str] = (), prefix: str = ""
) -> Iterator[Flag]:
    """The flags of ``settings_cls``'s fields, nested models' fields included (dotted), in field order.

    ``exclude`` holds dotted field paths (``max_turns``, ``engine.seed``) that get no flag; so do
    secrets and fields of a type no flag can express (all of them stay settable with ``--set``).
    ``prefix`` is prepended to every path (used for nested models).
    """
    for name, info in settings_cls.model_fields.items():
        dotted = f"{prefix}{name}"
        if dotted in exclude or is_secret_key(name):
            continue
        variants = union_variants(info.annotation)
        if variants:
            for sub in _union_flags(variants, dotted, exclude):
                if sub.group is None:
                    sub = Flag(sub.path, sub.option, sub.kwargs, sub.help, dotted, _description(info))
                yield sub
            continue
        tp = _unwrap_optional(info.annotation)
        if _is_model(tp):
            for sub in settings_flags(tp, exclude=exclude, prefix=f"{dotted}."):
                if sub.group is None:
                    sub = Flag(sub.path, sub.option, sub.kwargs, sub.help, dotted, _description(info))
                yield sub
            continue
        kwargs = _field_kwargs(info.annotation)
        if kwargs is None:
            continue
        path = tuple(dotted.split("."))
        if kwargs.get("action") is not argparse.BooleanOptionalAction:
            kwargs["metavar"] = path[-1].upper() if "choices" not in kwargs else None
        option = "--" + ".".join(p.replace("_", "-") for p in path)
        yield Flag(path, option, kwargs, _help(info))


def _union_flags(
    variants: tuple[type[BaseModel], ...], dotted: str, exclude: Collection[str]
) -> Iterator[Flag]:
    """The flags of a :func:`~llds_server.settings.typed_union` section: ``type`` with every variant's
    values as choices, then each other field once, its help naming the variants that have it and
    each one's default. A field two variants type differently is a programming error (TypeError)."""
    label = {v: "/".join(type_values(v)) for v in variants}
    seen: dict[str, list[tuple[type[BaseModel], FieldInfo]]] = {}
    for v in variants:
        for name, info in v.model_fields.items():
            seen.setdefault(name, []).append((v, info))
    for name, owners in seen.items():
        sub = f"{dotted}.{name}"
        if sub in exclude:
            continue
        if name == "type":
            choices = [t for v in variants for t in type_values(v)]
            option = "--" + sub.replace("_", "-")
            default = type_values(variants[0])[0]
            each = "; ".join(f"{label[v]}: {_description(v.model_fields['type'])}" for v in variants)
            yield Flag(tuple(sub.split(".")), option, {"type": str, "choices": choices, "metavar": None},
                       f"{each} (default: {default})")  # fmt: skip
            continue
        only = "" if len(owners) == len(variants) else f"[{', '.join(label[v] for v, _ in owners)}] "
        first = owners[0][1]
        tp = _unwrap_optional(first.annotation)
        if _is_model(tp):
            for flag in settings_flags(tp, exclude=exclude, prefix=f"{sub}."):
                yield Flag(flag.path, flag.option, flag.kwargs, only + flag.help, flag.group, flag.group_help)
            continue
        kwargs = [_field_kwargs(i.annotation) for _, i in owners]
        if kwargs[0] is None:
            continue
        if any(k != kwargs[0] for k in kwargs):
            raise TypeError(f"{sub}: the variants {[label[v] for v, _ in owners]} give it different types")
        flag_kwargs = dict(kwargs[0])
        if flag_kwargs.get("action") is not argparse.BooleanOptionalAction:
            flag_kwargs["metavar"] = name.upper() if "choices" not in flag_kwargs else None
        texts = [_default_text(i) for _, i in owners]
        defaults = (
            texts[0]
            if len(set(texts)) == 1
            else ", ".join(f"{label[v]} {t}" for (v, _), t in zip(owners, texts, strict=True))
        )
        text = f"{only}{_description(first)} {('(default: ' + defaults + ')').replace('%', '%%')}"
        yield Flag(tuple(sub.split(".")), "--" + sub.replace("_", "-"), flag_kwargs, text)


def _set_item(text: str) -> tuple[str, Any]:
    """One ``--set KEY=VALUE``: VALUE in TOML syntax, a bare word is a string."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE in TOML syntax), got {text!r}")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def add_settings_flags(
    parser: argparse.ArgumentParser,
    settings_cls: type[BaseModel],
    *,
    exclude: Collection[str] = (),
    aliases: Mapping[str, Collection[str]] | None = None,
    config_help: str | None = "TOML config file",
) -> None:
    """Add ``--config FILE`` (unless ``config_help`` is None), one flag per field of ``settings_cls``
    (see :func:`settings_flags`) and ``--set KEY=VALUE`` to ``parser``.

    ``aliases`` maps a dotted field path to further spellings of its flag (``{"index_dir":
    ["--index"]}``): the old names a command keeps accepting. Every flag defaults to None, which
    :func:`settings_overrides` reads as not given. A parser without a ``usage`` of its own gets a
    short one (the full list is in ``--help``; a usage error would print every flag).
    """
    aliases = dict(aliases or {})
    if parser.usage is None:
        config = " [--config FILE]" if config_help is not None else ""
        parser.usage = f"%(prog)s [-h]{config} [--FIELD VALUE ...] [--set KEY=VALUE ...]"
    if config_help is not None:
        parser.add_argument("--config", type=Path, metavar="FILE", help=config_help)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in settings_flags(settings_cls, exclude=exclude):
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if flag.group is not None:
            if flag.group not in groups:
                groups[flag.group] = parser.add_argument_group(f"{flag.group}.*", flag.group_help)
            target = groups[flag.group]
        names = [flag.option, *aliases.pop(flag.dest, ())]
        target.add_argument(*names, dest=flag.dest, default=None, help=flag.help, **flag.kwargs)
    if aliases:
        raise ValueError(f"aliases for fields without a flag: {sorted(aliases)}")
    parser.add_argument(
        "--set",
        dest=SET_DEST,
        action="append",
        type=_set_item,
        metavar="KEY=VALUE",
        help="set any field, also one without a flag (VALUE in TOML syntax; dotted KEY for a nested "
        "field, e.g. engine.max_batch_size=8); applied after the flags; repeatable",
    )


def _put(out: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        nxt = out.get(part)
        if not isinstance(nxt, dict):
            nxt = out[part] = {}
        out = nxt
    out[path[-1]] = value


def settings_overrides(
    args: argparse.Namespace, settings_cls: type[BaseModel], *, exclude: Collection[str] = ()
) -> dict[str, Any]:
    """The overrides for :meth:`ServiceSettings.load` from ``args`` parsed by a parser that
    :func:`add_settings_flags` (with the same ``exclude``) built: the flags given (nested fields as
    nested dicts), then every ``--set``."""
    given = vars(args)
    out: dict[str, Any] = {}
    for flag in settings_flags(settings_cls, exclude=exclude):
        value = given.get(flag.dest)
        if value is not None:
            _put(out, list(flag.path), list(value) if flag.kwargs.get("nargs") else value)
    for key, value in given.get(SET_DEST) or ():
        _put(out, key.split("."), value)
    return out
