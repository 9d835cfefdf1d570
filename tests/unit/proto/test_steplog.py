"""The step-record key module: one constant per key, each with a one-line docstring."""

from __future__ import annotations

import ast
import inspect
import itertools

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
