"""Config precedence: defaults < TOML < environment < explicit overrides."""

from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from llds_server.settings import (
    ConfigError,
    ConfigModel,
    ServiceSettings,
    redact_url,
    retyped,
    typed_union,
    without_secrets,
)


class _Cfg(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLDS_TEST_", extra="forbid")
    a: int = Field(default=1, ge=0)
    """a"""
    b: str = "default"
    """b"""
    admin_token: str = "secret"
    """token"""


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('a = 2\nb = "toml"\n')
    assert _Cfg.load().a == 1
    assert _Cfg.load(f).a == 2
    monkeypatch.setenv("LLDS_TEST_A", "3")
    c = _Cfg.load(f)
    assert (c.a, c.b) == (3, "toml")
    assert _Cfg.load(f, overrides={"a": 4, "b": None}).a == 4


def test_bad_values_and_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        _Cfg.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("a = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        _Cfg.load(bad)
    with pytest.raises(ValueError, match="a"):
        _Cfg.load(overrides={"a": -1})
    unknown = tmp_path / "u.toml"
    unknown.write_text("zzz = 1\n")
    with pytest.raises(ValueError, match="zzz"):
        _Cfg.load(unknown)


def test_written_config_hides_secrets(tmp_path: Path) -> None:
    text = _Cfg.load().write_toml(tmp_path / "out.toml").read_text()
    assert "secret" not in text and "a = 1" in text


class _Nested(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLDS_TEST2_", extra="forbid")
    max_tokens_per_turn: int = 7
    """not a secret although its name holds 'token'"""
    redis_url: str = "redis://:hunter2@127.0.0.1:6379/0"
    """a URL with a password"""
    admin_token: str = "secret"
    """a secret"""


def test_written_config_loads_back_without_its_secrets(tmp_path: Path) -> None:
    path = _Nested.load(overrides={"max_tokens_per_turn": 9}).write_toml(tmp_path / "out.toml")
    text = path.read_text()
    assert "hunter2" not in text and "secret" not in text and "admin_token" not in text
    back = _Nested.load(path)
    assert back.max_tokens_per_turn == 9 and back.redis_url == "redis://:***@127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://default:hunter2@redis:6380/1", "rediss://default:***@redis:6380/1"),
        ("http://rollout:8001/admin?token=abc&x=a%20b#f", "http://rollout:8001/admin?token=***&x=a%20b#f"),
        (
            "http://h/?API-Key=k;access_token=t&sig=s&v=1",
            "http://h/?API-Key=***;access_token=***&sig=***&v=1",
        ),
        ("http://127.0.0.1:8000/retrieve?topk=3", "http://127.0.0.1:8000/retrieve?topk=3"),
    ],
)
def test_urls_lose_their_passwords_and_secret_query_values(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_configs_for_trackers_lose_secret_fields_and_url_secrets_at_every_level() -> None:
    data = {"redis_url": "redis://:hunter2@r:6379/0", "admin_token": "t", "wandb_api_key": "k",
            "notify_urls": ["http://a:1/?token=t2", "http://b:2"], "max_tokens_per_turn": 3,
            "section": {"client_secret": "s", "url": "https://u:pw@h/"}}  # fmt: skip
    assert without_secrets(data) == {
        "redis_url": "redis://:***@r:6379/0",
        "notify_urls": ["http://a:1/?token=***", "http://b:2"],
        "max_tokens_per_turn": 3,
        "section": {"url": "https://u:***@h/"},
    }


class _Fast(ConfigModel):
    type: Literal["fast"] = "fast"
    """t"""
    size: int = 1
    """shared"""
    turbo: bool = False
    """fast's own"""


class _Slow(ConfigModel):
    type: Literal["slow"] = "slow"
    """t"""
    size: int = 1
    """shared"""


Part: Any = typed_union(_Fast, _Slow)


class _Plain(ConfigModel):
    part: Part = Field(default_factory=_Fast)
    """a union inside a plain section"""


class _Tree(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLDS_TREE_", env_nested_delimiter="__", extra="forbid")
    part: Part = Field(default_factory=_Fast)
    """the union"""
    plain: _Plain = Field(default_factory=_Plain)
    """a plain section"""


def test_a_source_that_retypes_a_section_drops_the_lower_sources_keys_the_new_type_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text("[part]\nsize = 3\nturbo = true\n[plain.part]\nsize = 4\nturbo = true\n")
    t = _Tree.load(toml, {"part": {"type": "slow"}, "plain": {"part": {"type": "slow"}}})
    assert (t.part.type, t.part.size) == ("slow", 3) and (t.plain.part.type, t.plain.part.size) == ("slow", 4)
    monkeypatch.setenv("LLDS_TREE_PART", '{"type": "slow", "size": 5}')
    t = _Tree.load(toml)
    assert (t.part.type, t.part.size) == ("slow", 5)  # env over TOML, retyped the same way
    back = _Tree.load(
        toml, {"part": {"type": "fast"}}
    ).part  # the env's shared size kept, the TOML's turbo again
    assert back == _Fast(size=5, turbo=True)
    assert retyped(_Tree, {"part": {"turbo": True}}, {"part": {"type": "nope"}}) == {"part": {"turbo": True}}
