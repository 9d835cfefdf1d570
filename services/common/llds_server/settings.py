"""Configuration loading shared by every service's config class.

Precedence: field defaults < TOML file < environment (``LLDS_<SERVICE>_<FIELD>``) < explicit
overrides (CLI flags). The resolved config can be written back as TOML next to a run's outputs.
"""

from __future__ import annotations

import argparse
import re
import tomllib
import typing
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Self, Union
from urllib.parse import unquote_plus, urlsplit, urlunsplit

import tomli_w
from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_URL_PASSWORD = re.compile(r"(://[^/@:]*:)[^/@]*@")
"""The password part of ``scheme://user:password@host``."""
_QUERY_PARAM = re.compile(r"((?:^|(?<=[&;]))([^=&;]+)=)[^&;]*")
"""One ``name=value`` of a URL's query string (group 1: ``name=``, group 2: the name)."""

PLACEHOLDER_SECRET = "change-me"
"""How the example env files (deploy/env.example, deploy/k8s/base/secrets.env.example) begin each secret."""

_TOML_DATA: ContextVar[dict[str, Any] | None] = ContextVar("_TOML_DATA", default=None)


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message names it."""


class ConfigModel(BaseModel):
    """Base class of a nested config section (``[regularizer]``): no unknown keys, docstrings as help."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


def type_values(variant: type[BaseModel]) -> tuple[str, ...]:
    """The ``type`` values that select ``variant`` (its ``type: Literal[...]`` field)."""
    info = variant.model_fields.get("type")
    values = typing.get_args(info.annotation) if info is not None else ()
    if not values or not all(isinstance(v, str) for v in values):
        raise TypeError(f"{variant.__name__} needs a `type: Literal[...]` field to be a variant")
    return values


def typed_union(*variants: type[BaseModel]) -> Any:
    """The type of a section whose ``type`` key picks the implementation's config among ``variants``.

    A bare string is the type alone (``regularizer = "none"``). A section without ``type`` (``[policy_loss] clip_eps = 0.3``) is the first variant's default type,
    so a TOML, env value or flag may set one field of the default variant alone; a key the chosen
    variant does not have is an error naming it, and an unknown ``type`` one listing the choices.
    :func:`llds_server.cli.settings_flags` gives such a section one flag per field of any variant.
    """
    tag = {c: "|".join(type_values(c)) for c in variants}
    tags = {v: tag[c] for c in variants for v in type_values(c)}
    default = variants[0].model_fields["type"].default

    def pick(value: Any) -> Any:
        t = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", None)
        return tags.get(t, t) if isinstance(t, str) else t

    def shorthand(value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value

    members = tuple(Annotated[c, Tag(tag[c])] for c in variants)
    return Annotated[Union[members], Discriminator(pick), BeforeValidator(shorthand)]  # noqa: UP007


def merged(cfg: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with ``overrides`` on top; a table (``[engine]``) is merged key by key at every depth, not
    replaced, except that an override table naming a ``type`` other than the one the base table names
    (a base without ``type`` names none) replaces it: ``{"regularizer": {"type": "none"}}`` over an LLDS
    table, whose keys mean nothing to the new type."""
    out = dict(cfg)
    for k, v in overrides.items():
        old = out.get(k)
        if (
            isinstance(v, dict)
            and isinstance(old, dict)
            and v.get("type", old.get("type")) == old.get("type")
        ):
            out[k] = merged(old, v)
        else:
            out[k] = v
    return out


def refuse_moved(data: Any, moved: dict[str, str], what: str) -> Any:
    """``data`` unchanged, or ValueError when it holds a key of an earlier release's layout: ``what``
    (``"these trainer settings moved into sections"``) and each such key with where it is now."""
    if isinstance(data, dict):
        old = [f"{k} (now {moved[k]})" for k in data if k in moved]
        if old:
            raise ValueError(f"{what}: {', '.join(old)}")
    return data


def union_variants(tp: Any) -> tuple[type[BaseModel], ...]:
    """The variants of a :func:`typed_union` field's annotation (as pydantic stores it), else ``()``."""
    if typing.get_origin(tp) not in (Union, typing.get_origin(int | str)):
        return ()
    out = []
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is Annotated:
            arg = typing.get_args(arg)[0]
        if not (isinstance(arg, type) and issubclass(arg, BaseModel)):
            return ()
        out.append(arg)
    return tuple(out)


def retyped(model: type[BaseModel], low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    """``low`` (a lower-precedence source's values) without what ``high`` makes meaningless.

    Where ``high`` gives a :func:`typed_union` section another ``type`` than ``low`` (a TOML preset's
    ``[engine]`` under ``--engine.type transformers``), ``low``'s keys the new variant does not declare
    are dropped and the ones it shares are kept (the preset's ``max_batch_size``, not vLLM's
    ``max_model_len``); deeper sections are treated the same way. A ``type`` no variant declares is
    left for validation to name.
    """
    out = dict(low)
    for name, info in model.model_fields.items():
        lo, hi = low.get(name), high.get(name)
        if isinstance(lo, str):
            lo = {"type": lo}
        if isinstance(hi, str):
            hi = {"type": hi}
        if not (isinstance(lo, dict) and isinstance(hi, dict)):
            continue
        variants = union_variants(info.annotation)
        if variants:
            default = variants[0].model_fields["type"].default
            new_type = hi.get("type", lo.get("type", default))
            new = next((v for v in variants if new_type in type_values(v)), None)
            if new is None:
                continue
            if new_type != lo.get("type", default):
                lo = {k: v for k, v in lo.items() if k in new.model_fields and k != "type"}
            out[name] = retyped(new, lo, hi)
        elif isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out[name] = retyped(info.annotation, lo, hi)
    return out


class _Retyped(PydanticBaseSettingsSource):
    """A lower-precedence source seen through :func:`retyped` against the sources above it."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.inner.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        return retyped(self.settings_cls, self.inner(), self.current_state)


class _TomlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class ServiceSettings(BaseSettings):
    """Base class of every service config: typed fields, each with a default and a docstring."""

    model_config = SettingsConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> Self:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, str) and (is_secret_key(name) or "://" in value):
                check_not_placeholder(f"{name} (env {self._env_name(name)})", value)
        return self

    @classmethod
    def _env_name(cls, name: str) -> str:
        """The environment variable(s) that set field ``name``."""
        alias = cls.model_fields[name].validation_alias
        if isinstance(alias, AliasChoices):
            if names := [a for a in alias.choices if isinstance(a, str) and a.isupper()]:
                return " or ".join(names)
        return (str(cls.model_config.get("env_prefix", "")) + name).upper()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        data = _TOML_DATA.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, _Retyped(settings_cls, env_settings)]
        if data:
            sources.append(_Retyped(settings_cls, _TomlSource(settings_cls, data)))
        return tuple(sources)

    @classmethod
    def load(
        cls,
        toml_path: str | Path | None = None,
        overrides: dict[str, Any] | None = None,
        section: str | None = None,
    ) -> Self:
        """Resolve the config from a TOML file (optionally one ``[section]``), env and overrides."""
        data: dict[str, Any] = {}
        if toml_path is not None:
            path = Path(toml_path)
            try:
                data = tomllib.loads(path.read_text())
            except FileNotFoundError as e:
                raise ConfigError(f"config file {path} does not exist") from e
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
            if section is not None:
                data = data.get(section, {})
        token = _TOML_DATA.set(data)
        try:
            return cls(**{k: v for k, v in (overrides or {}).items() if v is not None})
        finally:
            _TOML_DATA.reset(token)

    @classmethod
    def from_cli(cls, parser: argparse.ArgumentParser, argv: list[str] | None) -> Self:
        """Parse ``argv`` with a parser that :func:`llds_server.cli.add_settings_flags` gave this
        class's flags into a config.

        Unset flags fall through to env, TOML and defaults; a bad value becomes a usage error naming
        it (exit 2) before anything heavy is imported.
        """
        from llds_server.cli import settings_overrides

        args = parser.parse_args(argv)
        try:
            return cls.load(args.config, overrides=settings_overrides(args, cls))
        except ValueError as e:
            parser.error(str(e))
            raise  # parser.error exits; this keeps type checkers satisfied

    def write_toml(self, path: str | Path) -> Path:
        """Write the resolved config (secrets excluded) as TOML; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = without_secrets(self.model_dump(mode="json", exclude_none=True))
        path.write_text(tomli_w.dumps(data))
        return path


def is_secret_key(name: str) -> bool:
    """Fields (and URL query parameters) holding credentials (``admin_token``, ``redis_password``,
    ``api_key``), not ``max_tokens_per_turn``."""
    name = name.lower().replace("-", "_")
    return (
        name in ("token", "key", "sig", "signature")
        or name.endswith(("_token", "_key"))
        or "password" in name
        or "secret" in name
    )


def check_not_placeholder(name: str, value: str | None) -> None:
    """Raise :class:`ConfigError` naming ``name`` when ``value``, a secret or a URL with a password, still
    holds the example env file's placeholder (:data:`PLACEHOLDER_SECRET`): copied and never set, it is
    a password anyone who read the repository knows."""
    if not value:
        return
    secret = value
    if "://" in value:
        try:
            secret = urlsplit(value).password or ""
        except ValueError:  # not a URL after all: nothing in it is a password
            secret = ""
    if secret.startswith(PLACEHOLDER_SECRET):
        what = f"the password in {name}" if secret != value else name
        raise ConfigError(
            f"{what} is the example env file's placeholder {secret!r}: set a real secret "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


def redact_url(url: str) -> str:
    """``url`` fit for a log or a tracker: its password and the values of secret query parameters
    (``?token=``, ``?api_key=``, ...) replaced by ``***``."""
    url = _URL_PASSWORD.sub(r"\1***@", url)
    parts = urlsplit(url)
    query = _QUERY_PARAM.sub(
        lambda m: m[1] + "***" if is_secret_key(unquote_plus(m[2])) else m[0], parts.query
    )
    return urlunsplit(parts._replace(query=query)) if query != parts.query else url


def without_secrets(data: dict[str, Any]) -> dict[str, Any]:
    """Secret fields left out (the written file loads back, the secret comes from the environment
    again) and URLs redacted (:func:`redact_url`), at every nesting level: what may leave the process
    (a resolved config file, an experiment tracker's run config)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if not is_secret_key(k):
            out[k] = _redacted(v)
    return out


def _redacted(v: Any) -> Any:
    if isinstance(v, dict):
        return without_secrets(v)
    if isinstance(v, list):
        return [_redacted(x) for x in v]
    if isinstance(v, str) and "://" in v:
        return redact_url(v)
    return v
