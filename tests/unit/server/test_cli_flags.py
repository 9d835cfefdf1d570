"""Every command's flags come from its settings class (``llds_server.cli``): one ``--field-name`` per
field on the command's real parser, the value it gives reaching the resolved settings, unset flags
leaving TOML values alone, ``--x/--no-x`` booleans, ``Literal`` choices, dotted nested flags, ``--set``
for every field, and the old spellings users and deployments pass."""

from __future__ import annotations

import argparse
import ast
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import pytest
import tomli_w
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from llds import up
from llds.dashboard import cli as dashboard_cli
from llds.dashboard.config import DashboardConfig
from llds_retriever import cli as retriever_cli
from llds_retriever.config import RetrieverConfig
from llds_rollout import cli as rollout_cli
from llds_rollout.config import RolloutSettings
from llds_server.cli import add_settings_flags, settings_overrides
from llds_server.settings import ServiceSettings
from llds_trainer import cli as trainer_cli
from llds_trainer.config import TrainerConfig

REPO = Path(__file__).resolve().parents[3]


def _retriever(argv: list[str]) -> RetrieverConfig:
    args = retriever_cli.serve_parser().parse_args(argv)
    return retriever_cli.load_config(args.config, settings_overrides(args, RetrieverConfig))


def _rollout(argv: list[str]) -> RolloutSettings:
    return rollout_cli.load_settings(rollout_cli.serve_parser().parse_args(argv))


def _answer(argv: list[str]) -> RolloutSettings:
    args = rollout_cli.answer_parser().parse_args(["who wrote hamlet", *argv])
    return rollout_cli.load_settings(args, exclude=rollout_cli.ANSWER_OWN, train=False)


@dataclass
class Command:
    """One command whose flags come from ``settings``: its parser builder and the way it resolves."""

    name: str
    settings: type[ServiceSettings]
    parser: Callable[[], argparse.ArgumentParser]
    resolve: Callable[[list[str]], BaseModel]
    base: list[str] = field(default_factory=list)
    """Flags every resolution gets (what the defaults alone do not validate without)."""
    needs: dict[str, list[str]] = field(default_factory=dict)
    """Flags a field's sample value needs beside it (cross-field rules of the class)."""
    no_flag: set[str] = field(default_factory=set)
    """Fields, dotted, that get no flag on purpose."""


COMMANDS = [
    Command(
        "trainer run",
        TrainerConfig,
        trainer_cli.build_parser,
        trainer_cli.load_config,
        # switching LLDS on by the alarm needs a run without it
        needs={
            f"lld.alarm.{k}": ["--regularizer.type", "none"]
            for k in (
                "trigger",
                "llds.type",
                "llds.coef",
                "llds.gate",
                "llds.normalize",
                "llds.answer_weight_mode",
                "llds.answer_weight",
            )
        },
    ),
    Command(
        "rollout serve",
        RolloutSettings,
        rollout_cli.serve_parser,
        _rollout,
        base=["--dataset", "train.jsonl"],
        needs={"engine.weight_transfer": ["--engine.device", "cuda"]},
        no_flag={
            "admin_token",
            "api_key",
        },  # secrets: env LLDS_ADMIN_TOKEN / LLDS_API_KEY, not the process list
    ),
    Command(
        "answer",
        RolloutSettings,
        rollout_cli.answer_parser,
        _answer,
        needs={"engine.weight_transfer": ["--engine.device", "cuda"]},
        no_flag={
            "admin_token",
            "api_key",
            "train",
            "max_turns",
        },  # never trains; --max-turns is the request's
    ),
    Command(
        "retriever serve",
        RetrieverConfig,
        retriever_cli.serve_parser,
        _retriever,
        needs={"faiss_index": ["--corpus", "corpus.jsonl"]},
    ),
    Command("up", up.UpConfig, up.build_parser, lambda argv: up.parse_args(argv)[0]),
    Command("dashboard serve", DashboardConfig, dashboard_cli.build_parser, dashboard_cli.parse_args),
]
IDS = [c.name for c in COMMANDS]


@pytest.fixture(autouse=True)
def _no_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("LLDS_") or name == "REDIS_URL":
            monkeypatch.delenv(name)


# ---------------------------------------------------------------------------- fields and samples


def _inner(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _scalar_ok(tp: Any) -> bool:
    tp = _inner(tp)
    if typing.get_origin(tp) is Literal:
        return all(isinstance(v, str) for v in typing.get_args(tp))
    return tp in (int, float, str, Path)


def _expressible(tp: Any) -> bool:
    """This test's own reading of the rule: which field types a flag can carry."""
    tp = _inner(tp)
    origin = typing.get_origin(tp)
    if origin is list:
        return _scalar_ok(typing.get_args(tp)[0])
    if origin is tuple:
        args = typing.get_args(tp)
        return Ellipsis not in args and len(set(args)) == 1 and _scalar_ok(args[0])
    return tp is bool or _scalar_ok(tp)


VARIANT_NEEDS: dict[str, list[str]] = {}
"""Dotted field of a ``type``-selected section's variant -> the flag choosing that variant."""


def _variants(tp: Any) -> list[type[BaseModel]]:
    """This test's own reading of a ``typed_union`` annotation: a union of models."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return []
    args = [typing.get_args(a)[0] if typing.get_origin(a) is Annotated else a for a in typing.get_args(tp)]
    return list(args) if all(isinstance(a, type) and issubclass(a, BaseModel) for a in args) else []


def _fields(
    cls: type[BaseModel], prefix: str = "", needs: list[str] | None = None
) -> Iterator[tuple[str, FieldInfo]]:
    """Every leaf field of ``cls`` (nested models' fields dotted; every variant's fields of a section
    whose ``type`` picks one, ``type`` itself as one choice among all the variants' values)."""
    for name, info in cls.model_fields.items():
        dotted = f"{prefix}{name}"
        variants = _variants(info.annotation)
        if variants:
            values = [v for c in variants for v in typing.get_args(c.model_fields["type"].annotation)]
            yield f"{dotted}.type", FieldInfo(annotation=Literal[tuple(values)], default=values[0],
                                              description=variants[0].model_fields["type"].description)  # fmt: skip
            seen: set[str] = set()
            for c in variants:
                pick = [
                    "--" + f"{dotted}.type".replace("_", "-"),
                    typing.get_args(c.model_fields["type"].annotation)[0],
                ]
                for sub, sub_info in _fields(c, f"{dotted}.", [*(needs or []), *pick]):
                    if sub != f"{dotted}.type" and sub not in seen:
                        seen.add(sub)
                        yield sub, sub_info
            VARIANT_NEEDS.pop(f"{dotted}.type", None)  # the choice itself needs no other choice
            continue
        if needs:
            VARIANT_NEEDS.setdefault(dotted, needs)
        tp = _inner(info.annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            yield from _fields(tp, f"{dotted}.", needs)
        else:
            yield dotted, info


def _option(dotted: str) -> str:
    return "--" + dotted.replace("_", "-")


def _flag_fields(cmd: Command) -> list[tuple[str, FieldInfo]]:
    return [(d, i) for d, i in _fields(cmd.settings) if d not in cmd.no_flag and _expressible(i.annotation)]


def _candidates(info: FieldInfo) -> list[Any]:
    """Values of the field's type, other than its default, that its own constraints accept."""
    tp = _inner(info.annotation)
    default = info.get_default(call_default_factory=True)
    origin = typing.get_origin(tp)
    if tp is bool:
        raw: list[Any] = [not default]
    elif origin is Literal:
        raw = list(typing.get_args(tp))
    elif origin is list:
        one = _scalar_candidates(typing.get_args(tp)[0], None)
        raw = [one[:2], one[2:4]] if len(one) >= 4 else [one[:2]]
    elif origin is tuple:
        args = typing.get_args(tp)
        raw = [tuple(_scalar_candidates(args[0], None)[: len(args)])]
    else:
        raw = _scalar_candidates(tp, default)
    check = TypeAdapter(Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation)
    out = []
    for v in raw:
        if v == default and len(raw) > 1:  # a one-value choice (``type = "adamw"``) can only be given as is
            continue
        try:
            check.validate_python(v)
        except ValidationError:
            continue
        out.append(v)
    return out


def _scalar_candidates(tp: Any, default: Any) -> list[Any]:
    tp = _inner(tp)
    if typing.get_origin(tp) is Literal:
        return list(typing.get_args(tp))
    if tp is int:
        d = default if isinstance(default, int) else 0
        return [d + 1, d - 1, 1, 2, 7, 300, 5000, 70000]
    if tp is float:
        d = default if isinstance(default, float) else 0.0
        return [d * 2, d / 2, d + 0.5, 0.5, 0.25, 1.5, 2.5, 0.75]
    if tp is Path:
        return [Path("/tmp/sample/one"), Path("/tmp/sample/two")]
    return ["sample-one", "sample-two", "http://sample-one:1", "http://sample-two:2"]  # a URL for URL fields


def _argv(dotted: str, value: Any) -> list[str]:
    opt = _option(dotted)
    if isinstance(value, bool):
        return [opt] if value else ["--no-" + opt[2:]]
    if isinstance(value, list):
        return [tok for v in value for tok in (opt, str(v))]
    if isinstance(value, tuple):
        return [opt, *map(str, value)]
    return [opt, str(value)]


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    *head, last = dotted.split(".")
    out: dict[str, Any] = {last: value}
    for part in reversed(head):
        out = {part: out}
    return out


def _toml_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_toml_value(v) for v in value]
    return value


# ---------------------------------------------------------------------------- the walk


def _settings_classes_in_source() -> set[str]:
    found = set()
    for root in ("services", "launcher"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "ServiceSettings" for b in node.bases
                ):
                    found.add(node.name)
    return found


def test_every_settings_class_has_a_command_here() -> None:
    assert _settings_classes_in_source() == {c.settings.__name__ for c in COMMANDS}


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_every_field_is_documented(cmd: Command) -> None:
    undocumented = [d for d, info in _fields(cmd.settings) if not (info.description or "").strip()]
    assert not undocumented, f"{cmd.settings.__name__}: fields without a docstring: {undocumented}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_every_expressible_field_has_its_flag_with_its_docstring(cmd: Command) -> None:
    parser = cmd.parser()
    assert "--set KEY=VALUE" in parser.format_help()  # every help string formats (% escaped)
    actions = parser._option_string_actions
    fields = dict(_fields(cmd.settings))
    missing = [d for d, _ in _flag_fields(cmd) if _option(d) not in actions]
    assert not missing, f"{cmd.name}: fields without a derived flag: {missing}"
    for dotted, info in _flag_fields(cmd):
        action = actions[_option(dotted)]
        assert action.dest == dotted
        assert action.default is None, f"{dotted}: an unset flag must read as not given"
        first_words = " ".join((info.description or "").split()[:4])
        assert action.help and first_words.replace("%", "%%") in action.help and "(default: " in action.help
    # nothing falls through silently: a field gets a flag, or is listed in no_flag on purpose
    without = {d for d in fields if _option(d) not in actions or actions[_option(d)].dest != d}
    assert without == cmd.no_flag, f"{cmd.name}: fields with no flag: {sorted(without)}"
    for secret in ("admin_token", "api_key"):
        assert _option(secret) not in actions


def _unresolved(cmd: Command, given: Callable[[str, Any], list[str]]) -> list[str]:
    """The fields none of whose sample values comes back from ``cmd.resolve(given(field, value))``;
    a value comes back wrong fails at once. A value the class's cross-field rules reject is passed
    over for the next one."""
    failed = []
    for dotted, info in _flag_fields(cmd):
        for value in _candidates(info):
            try:
                got = cmd.resolve([*cmd.needs.get(dotted, []), *VARIANT_NEEDS.get(dotted, []),
                                   *given(dotted, value)])  # fmt: skip
            except (ValidationError, ValueError):
                continue
            assert _get(got, dotted) == value, (dotted, value, _get(got, dotted))
            break
        else:
            failed.append(dotted)
    return failed


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_each_flag_sets_its_field(cmd: Command) -> None:
    failed = _unresolved(cmd, lambda dotted, value: [*cmd.base, *_argv(dotted, value)])
    assert not failed, f"{cmd.name}: no sample value of these fields resolved: {failed}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_an_unset_flag_leaves_the_toml_value(cmd: Command, tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"

    def given(dotted: str, value: Any) -> list[str]:
        toml.write_text(tomli_w.dumps(_nested(dotted, _toml_value(value))))
        base = [] if _option(dotted) in cmd.base else cmd.base  # the field the base would set
        return [*base, "--config", str(toml)]

    failed = _unresolved(cmd, given)
    assert not failed, f"{cmd.name}: no TOML sample of these fields resolved: {failed}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_flags_beat_env_and_toml(cmd: Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dotted = next(d for d, _ in _flag_fields(cmd) if d in ("port", "steps"))
    toml = tmp_path / "c.toml"
    toml.write_text(f"{dotted} = 11\n")
    assert _get(cmd.resolve([*cmd.base, "--config", str(toml)]), dotted) == 11
    prefix = cmd.settings.model_config.get("env_prefix", "")
    monkeypatch.setenv(f"{prefix}{dotted.upper()}", "12")
    assert _get(cmd.resolve([*cmd.base, "--config", str(toml)]), dotted) == 12
    assert _get(cmd.resolve([*cmd.base, "--config", str(toml), _option(dotted), "13"]), dotted) == 13


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_bool_flags_both_ways(cmd: Command, tmp_path: Path) -> None:
    bools = [d for d, i in _flag_fields(cmd) if _inner(i.annotation) is bool]
    assert bools or cmd.name == "dashboard serve"
    toml = tmp_path / "c.toml"
    for dotted in bools:
        for value in (True, False):
            needs = [*cmd.base, *cmd.needs.get(dotted, []), *VARIANT_NEEDS.get(dotted, [])]
            if dotted == "train" and not value:
                needs = []  # --no-train needs no dataset
            got = cmd.resolve([*needs, *_argv(dotted, value)])
            assert _get(got, dotted) is value, (dotted, value)
            # and over a TOML value of the other sense
            toml.write_text(tomli_w.dumps(_nested(dotted, not value)))
            got = cmd.resolve([*needs, "--config", str(toml), *_argv(dotted, value)])
            assert _get(got, dotted) is value, (dotted, value)


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_a_bad_choice_is_a_usage_error_naming_it(cmd: Command, capsys: pytest.CaptureFixture[str]) -> None:
    literals = [d for d, i in _flag_fields(cmd) if typing.get_origin(_inner(i.annotation)) is Literal]
    assert literals or cmd.name == "dashboard serve"
    for dotted in literals:
        with pytest.raises(SystemExit) as e:
            cmd.parser().parse_args([_option(dotted), "sideways-xyz"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "sideways-xyz" in err and _option(dotted) in err and "invalid choice" in err


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_a_bad_number_is_a_usage_error_naming_it(cmd: Command, capsys: pytest.CaptureFixture[str]) -> None:
    ints = [d for d, i in _flag_fields(cmd) if _inner(i.annotation) is int]
    with pytest.raises(SystemExit) as e:
        cmd.parser().parse_args([_option(ints[0]), "eleven"])
    assert e.value.code == 2 and "'eleven'" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_set_reaches_any_field(cmd: Command) -> None:
    dotted = next(d for d, _ in _flag_fields(cmd) if d in ("port", "steps"))
    got = cmd.resolve([*cmd.base, "--set", f"{dotted}=21"])
    assert _get(got, dotted) == 21
    # --set comes after the flags
    assert _get(cmd.resolve([*cmd.base, _option(dotted), "22", "--set", f"{dotted}=23"]), dotted) == 23


def test_set_reaches_fields_without_a_flag_and_nested_ones(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = trainer_cli.load_config(["--set", "optimizer.betas=[0.5, 0.6]", "--set", 'trackers=["wandb"]'])
    assert cfg.optimizer.betas == (0.5, 0.6) and cfg.trackers == ["wandb"]
    s = _rollout(["--dataset", "d.jsonl", "--set", "engine.max_batch_size=3", "--set", "admin_token=tok"])
    assert s.engine.max_batch_size == 3 and s.admin_token == "tok"
    assert _rollout(["--no-train", "--set", "engine.type=transformers"]).engine.type == "transformers"
    assert trainer_cli.load_config(["--set", "wandb_project=bare word"]).wandb_project == "bare word"
    with pytest.raises(SystemExit) as e:
        trainer_cli.build_parser().parse_args(["--set", "no-equals-sign"])
    assert e.value.code == 2 and "no-equals-sign" in capsys.readouterr().err
    with pytest.raises(ValidationError, match="no_such_field"):
        trainer_cli.load_config(["--set", "no_such_field=1"])


def test_nested_dotted_flags_reach_the_nested_model_and_merge_with_toml_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "r.toml"
    toml.write_text('train = false\n[engine]\ndtype = "bfloat16"\nseed = 4\n')
    monkeypatch.setenv("LLDS_ROLLOUT_ENGINE", '{"seed": 5, "torch_threads": 2}')
    s = _rollout(["--config", str(toml), "--engine.type", "transformers", "--engine.max-batch-size", "7"])
    e = s.engine
    assert (e.type, e.max_batch_size) == ("transformers", 7)  # flags
    assert (e.dtype, e.seed, e.torch_threads) == ("bfloat16", 5, 2)  # TOML, env over TOML
    monkeypatch.delenv("LLDS_ROLLOUT_ENGINE")
    e = _rollout(["--config", str(toml), "--no-engine.openai-api", "--engine.max-model-len", "512"]).engine
    assert (e.type, e.openai_api, e.max_model_len, e.seed) == ("vllm", False, 512, 4)  # the default type
    with pytest.raises(ValidationError, match=r"engine\.transformers\.openai_api"):  # vLLM's field, not its
        _rollout(["--config", str(toml), "--engine.type", "transformers", "--no-engine.openai-api"])
    overrides = settings_overrides(
        rollout_cli.serve_parser().parse_args(["--engine.seed", "1", "--port", "2"]), RolloutSettings
    )
    assert overrides == {"engine": {"seed": 1}, "port": 2}


def test_a_constraint_violation_takes_each_commands_error_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert trainer_cli.run_main(["--model", "m", "--port", "70000"]) == 2
    assert "port" in capsys.readouterr().err
    assert rollout_cli.serve_main(["--model", "m", "--no-train", "--group-size", "0"]) == 2
    assert "group_size" in capsys.readouterr().err
    assert retriever_cli.serve_main(["--index", "/x", "--max-batch", "0"]) == 2
    assert "max_batch" in capsys.readouterr().err
    for parse in (
        lambda: up.parse_args(["--steps", "-1"]),
        lambda: dashboard_cli.parse_args(["--port", "-5"]),
    ):
        with pytest.raises(SystemExit) as e:
            parse()
        assert e.value.code == 2


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("LLDS_ADMIN_TOKEN", "change-me-admin-token"),  # deploy/env.example's values, copied unchanged
        ("LLDS_TRAINER_REDIS_URL", "redis://:change-me-redis-password@redis:6379/0"),
        ("LLDS_ROLLOUT_REDIS_URL", "redis://:change-me-redis-password@redis:6379/0"),
        ("REDIS_URL", "redis://:change-me-redis-password@127.0.0.1:6379/0"),
    ],
)
def test_a_placeholder_secret_is_refused_at_start_naming_its_variable(
    var: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(var, value)
    starts = {
        "LLDS_ADMIN_TOKEN": ["trainer", "rollout", "up"],
        "LLDS_TRAINER_REDIS_URL": ["trainer"],
        "LLDS_ROLLOUT_REDIS_URL": ["rollout"],
        "REDIS_URL": ["up"],
    }[var]
    for name in starts:
        if name == "trainer":
            assert trainer_cli.run_main(["--model", "m"]) == 2
        elif name == "rollout":
            assert rollout_cli.serve_main(["--model", "m", "--no-train"]) == 2
        else:
            with pytest.raises(SystemExit) as e:
                raise SystemExit(up.main(["--preset", "tiny", "--steps", "1"]))  # a usage error exits itself
            assert e.value.code == 2
        err = capsys.readouterr().err
        assert var in err and "placeholder" in err, (name, err)


# ---------------------------------------------------------------------------- the spellings in use

OLD_SPELLINGS = [
    # (command, argv, dotted field, value)
    ("trainer run", ["--notify-url", "http://a:1", "--notify-url", "http://b:2"], "notify_urls",
     ["http://a:1", "http://b:2"]),
    ("trainer run", ["--no-resume"], "resume", False),
    ("trainer run", ["--reference-model", "ref"], "reference_model", "ref"),
    ("trainer run", ["--consumer-name", "t-1"], "consumer_name", "t-1"),
    ("rollout serve", ["--no-train"], "train", False),
    ("rollout serve", ["--no-train", "--engine", "transformers"], "engine.type", "transformers"),
    ("rollout serve", ["--no-train", "--run-id", "r1"], "run_id", "r1"),
    ("answer", ["--engine", "transformers", "--model", "m", "--retriever-url", "http://r:1"], "engine.type",
     "transformers"),
    ("answer", ["--model", "m"], "model", "m"),
    ("retriever serve", ["--index", "/idx"], "index_dir", Path("/idx")),
    ("retriever serve", ["--faiss-index", "/f.index", "--corpus", "/c.jsonl", "--type", "dense"], "faiss_index",
     Path("/f.index")),
    ("retriever serve", ["--max-wait-ms", "2.5"], "max_wait_ms", 2.5),
    ("up", ["--no-dashboard"], "dashboard", False),
    ("up", ["--exit-when-done"], "exit_when_done", True),
    ("up", ["--restart-on-failure", "--max-restarts", "5"], "max_restarts", 5),
    ("up", ["--verbose"], "verbose", True),
    ("up", ["--redis-port", "0", "--dashboard-port", "0"], "redis_port", 0),
    ("up", ["--rollout-config", "r.toml"], "rollout_config", Path("r.toml")),
    ("dashboard serve", ["--poll-interval", "2"], "poll_interval_s", 2.0),
    ("dashboard serve", ["--timeout", "3"], "timeout_s", 3.0),
    ("dashboard serve", ["--train-log", "t.jsonl"], "train_log", Path("t.jsonl")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "argv", "dotted", "value"), OLD_SPELLINGS, ids=[f"{n} {a[0]}" for n, a, *_ in OLD_SPELLINGS]
)
def test_old_spellings_still_set_the_same_field(name: str, argv: list[str], dotted: str, value: Any) -> None:
    cmd = next(c for c in COMMANDS if c.name == name)
    assert _get(cmd.resolve(argv), dotted) == value


def test_resume_and_write_config_stay_extra_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert up.build_parser().parse_args(["--resume", "runs/x"]).resume == Path("runs/x")
    with pytest.raises(SystemExit):
        up.parse_args(["--resume", str(tmp_path), "--set", "preset=gpu"])  # --set cannot sneak it in
    assert "drop --preset" in capsys.readouterr().err
    assert rollout_cli.serve_parser().parse_args(["--write-config", "o.toml"]).write_config == "o.toml"


def _children_argv(tmp_path: Path) -> dict[str, list[str]]:
    cfg = up.UpConfig.load(overrides={"preset": "tiny", "run_dir": tmp_path / "run"})
    u = up.Up(cfg)
    u.redis_url = "redis://127.0.0.1:1/0"
    u.paths = {"world": tmp_path, "index": tmp_path / "index", "policy": tmp_path / "policy"}
    return {name: u.spec(name)[0] for name in ("retriever", "rollout", "trainer", "dashboard")}


def test_llds_up_childrens_argv_parse_with_their_commands_parsers(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "unit" / "deploy"))
    from deploy_tools import entrypoint_error

    for name, argv in _children_argv(tmp_path).items():
        assert argv[1:3] == ["-m", "llds.cli"]
        assert entrypoint_error(["llds", *argv[3:]]) is None, name
    rollout = _rollout(_children_argv(tmp_path)["rollout"][5:])
    assert rollout.host == "127.0.0.1" and rollout.weights_root == tmp_path / "run" / "weights"


def test_experiment_up_commands_parse(tmp_path: Path) -> None:
    from llds import experiment

    args = argparse.Namespace(steps=3, preset=next(iter(experiment.PRESETS)), model="m")
    for resume in (False, True):
        cmd = experiment._up_command(args, tmp_path / "run", {"trainer": tmp_path / "t.toml"}, resume)
        assert cmd[3] == "up"
        parsed = up.build_parser().parse_args(cmd[4:])
        assert parsed.steps == 3 and parsed.exit_when_done and parsed.retriever_port == 0


def test_add_settings_flags_refuses_an_alias_of_no_flag() -> None:
    with pytest.raises(ValueError, match="admin_token"):
        add_settings_flags(argparse.ArgumentParser(), RolloutSettings, aliases={"admin_token": ["--token"]})


def test_a_type_selected_section_from_flags_toml_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[regularizer]``, ``[policy_loss]``, ``[correction]``, ``[lld.alarm]``: ``type`` picks the variant
    from any source, the others fill in its fields, and a field of another variant is refused by name."""
    toml = tmp_path / "t.toml"
    toml.write_text('[policy_loss]\ntype = "gspo"\n[correction]\nlow = 0.7\n')
    monkeypatch.setenv("LLDS_TRAINER_CORRECTION__TYPE", "seq_mis")
    monkeypatch.setenv("LLDS_TRAINER_REGULARIZER__COEF", "0.3")
    cfg = trainer_cli.load_config(["--config", str(toml), "--policy-loss.clip-eps-high", "0.001",
                                   "--regularizer.gate", "token"])  # fmt: skip
    assert cfg.policy_loss.model_dump() == {"type": "gspo", "clip_eps": 3e-4, "clip_eps_high": 0.001}
    assert (cfg.correction.type, cfg.correction.low, cfg.correction.high) == ("seq_mis", 0.7, 2.0)  # type: ignore[union-attr]
    assert (cfg.regularizer.type, cfg.regularizer.coef, cfg.regularizer.gate) == ("llds", 0.3, "token")  # type: ignore[union-attr]
    # no type given: the section's default variant
    assert trainer_cli.load_config(["--policy-loss.clip-eps", "0.1"]).policy_loss.type == "ppo"
    # a bare string is the type alone
    monkeypatch.delenv("LLDS_TRAINER_REGULARIZER__COEF")
    toml.write_text('regularizer = "none"\n')
    assert trainer_cli.load_config(["--config", str(toml)]).regularizer.type == "none"
    with pytest.raises(ValidationError, match=r"regularizer\.none\.coef\n.*Extra inputs"):
        trainer_cli.load_config(["--regularizer.type", "none", "--regularizer.coef", "0.3"])
    with pytest.raises(ValidationError, match="'clip' found using"):
        trainer_cli.load_config(["--set", "policy_loss.type=clip"])
    with pytest.raises(SystemExit):  # a bad choice is a usage error before validation
        trainer_cli.build_parser().parse_args(["--lld.alarm.type", "shout"])
    # a flat setting of earlier releases names where it lives now
    toml.write_text("llds_lambda = 0.3\nlr = 1e-5\n")
    with pytest.raises(
        ValidationError, match=r"llds_lambda \(now regularizer.coef\), lr \(now optimizer.lr\)"
    ):
        trainer_cli.load_config(["--config", str(toml)])


def test_merged_overlays_tables_at_every_depth_and_restarts_a_retyped_one() -> None:
    from llds_server.settings import merged

    base = {
        "a": 1,
        "engine": {"x": 1, "deep": {"p": 1, "q": 2}},
        "regularizer": {"type": "llds", "coef": 0.3},
    }
    got = merged(base, {"engine": {"deep": {"q": 3}}, "regularizer": {"coef": 0.5}})
    assert got == {
        "a": 1,
        "engine": {"x": 1, "deep": {"p": 1, "q": 3}},
        "regularizer": {"type": "llds", "coef": 0.5},
    }
    assert merged(base, {"regularizer": {"type": "none"}})["regularizer"] == {"type": "none"}
    assert merged(base, {"regularizer": {"type": "llds", "gate": "token"}})["regularizer"] == {
        "type": "llds", "coef": 0.3, "gate": "token"}  # fmt: skip
    assert base["engine"]["deep"] == {"p": 1, "q": 2}  # the input is not changed
