"""Training prompts from a JSONL file with Search-R1 columns (CONTRACTS.md "Data files")."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_QUESTION_RE = re.compile(r"Question:\s*(.*?)\s*$", re.DOTALL)


class DatasetError(ValueError):
    """A dataset file or row that cannot be used; names the file and line."""


@dataclass(frozen=True)
class PromptRow:
    """One training question."""

    prompt_id: str
    """``{data_source}:{index}``; unique across merged datasets."""
    question: str
    golds: list[str]


def _row(d: dict, where: str) -> PromptRow:
    question = d.get("question")
    if not question:
        prompt = d.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            m = _QUESTION_RE.search(str(prompt[0].get("content", "")))
            question = m.group(1) if m else str(prompt[0].get("content", ""))
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: no question (neither 'question' nor a parsable 'prompt')")
    golds = d.get("golden_answers")
    if golds is None:
        golds = ((d.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not golds:
        raise DatasetError(f"{where}: no gold answers (golden_answers or reward_model.ground_truth.target)")
    source = str(d.get("data_source") or "data")
    index = (d.get("extra_info") or {}).get("index", d.get("id"))
    if index is None:
        raise DatasetError(f"{where}: no row index (extra_info.index or id)")
    return PromptRow(prompt_id=f"{source}:{index}", question=question, golds=[str(g) for g in golds])


def load_rows(path: Path) -> list[PromptRow]:
    """Every row of a JSONL file; raises :class:`DatasetError` on the first bad line."""
    if path.suffix == ".parquet":
        raise DatasetError(f"{path}: parquet needs pyarrow, which this environment lacks; convert to JSONL")
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e}") from e
    rows: list[PromptRow] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{n}: not JSON: {e}") from e
        rows.append(_row(d, f"{path}:{n}"))
    if not rows:
        raise DatasetError(f"{path}: no rows")
    ids = [r.prompt_id for r in rows]
    if len(set(ids)) != len(ids):
        raise DatasetError(f"{path}: duplicate prompt ids (data_source:index) would share a group")
    return rows


def endless(rows: list[PromptRow], *, shuffle: bool, seed: int) -> Iterator[tuple[PromptRow, int]]:
    """(row, epoch) forever, reshuffled every epoch."""
    rng = random.Random(seed)
    epoch = 0
    while True:
        order = list(rows)
        if shuffle:
            rng.shuffle(order)
        for row in order:
            yield row, epoch
        epoch += 1
