"""The step-record key module: one constant per key, each with a one-line docstring; the one reader
of step logs, which leaves out a torn last line and names a damaged one."""

from __future__ import annotations

import ast
import inspect
import itertools
from pathlib import Path

import pytest

from llds_proto import steplog


def _constants() -> dict[str, str]:
    return {k: v for k, v in vars(steplog).items() if k.isupper() and isinstance(v, str)}


def test_keys_are_the_constants_and_distinct() -> None:
    consts = _constants()
    assert len(consts) >= 40
    assert steplog.KEYS == frozenset(consts.values())
    assert len(set(consts.values())) == len(consts), "two constants name the same key"


def test_every_constant_has_a_one_line_docstring() -> None:
    body = ast.parse(inspect.getsource(steplog)).body
    documented = set()
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.Assign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            doc = nxt.value.value
            assert doc.strip() and "\n" not in doc, node.targets[0]
            documented |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    assert set(_constants()) <= documented, sorted(set(_constants()) - documented)


def test_read_records_leaves_out_a_torn_last_line_only(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    assert steplog.read_step_log(path) == steplog.StepLog([])  # not written yet
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "loss/')
    assert steplog.read_step_log(path) == steplog.StepLog([{"step": 1}, {"step": 2}], torn_line=4)
    path.write_bytes(b'{"step": 1}\n{"step": 2, "x": "\xc3')  # cut inside a UTF-8 character
    assert steplog.read_records(path) == [{"step": 1}]
    path.write_text('{"step": 1}\n{"step": 2}')  # whole but for its newline: kept
    assert steplog.read_step_log(path) == steplog.StepLog([{"step": 1}, {"step": 2}])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n', r"train_log.jsonl:2 is not JSON"),
        # records appended to a torn line (what a restart that did not cut the log would write)
        ('{"step": 1}\n{"step": 2, "lo{"step": 2}\n{"step": 3}\n', r"train_log.jsonl:2 is not JSON"),
        ('{"step": 1}\n[2]\n', r"train_log.jsonl:2 is not a JSON object"),
    ],
)
def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "train_log.jsonl"
    path.write_text(text)
    with pytest.raises(steplog.StepLogError, match=message):
        steplog.read_records(path)


def test_tail_reads_whole_new_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    tail = steplog.StepLogTail(path)
    assert tail.read() == []  # not written yet
    path.write_text('{"step": 1}\n{"step": 2')
    assert tail.read() == [{"step": 1}]
    with path.open("a") as f:
        f.write(', "x": 1}\nnot json\n[1]\n')
    assert tail.read() == [{"step": 2, "x": 1}]
    assert tail.bad_lines == 2
    assert tail.read() == []
    path.write_text('{"step": 9}\n')  # cut by a restarted trainer: read again from the start
    assert tail.read() == [{"step": 9}]


def test_tail_after_a_cut_can_go_on_after_what_the_log_holds(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4')
    tail = steplog.StepLogTail(path, after_cut="skip")
    tail.skip_existing()
    assert tail.read() == []
    with path.open("a") as f:
        f.write("}\n")
    assert tail.read() == [{"step": 4}]
    path.write_text('{"step": 1}\n{"step": 2}\n')  # steps 3 and 4 lost with the crash
    assert tail.read() == []
    with path.open("a") as f:
        f.write('{"step": 3}\n')
    assert tail.read() == [{"step": 3}]
