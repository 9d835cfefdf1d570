"""Training prompts from a JSONL file with Search-R1 columns (CONTRACTS.md "Data files")."""

from __future__ import annotations

import json
import random
import re
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


class DataOrder:
    """The run's data order as positions: position p is (row, epoch) ``at(p)``, every row once per
    epoch, each epoch reshuffled by one generator seeded with ``seed`` (the order a single replica
    has always walked), so that any replica can start anywhere in it (the shared cursor:
    :mod:`llds_rollout.cursor`)."""

    def __init__(self, rows: list[PromptRow], *, shuffle: bool, seed: int) -> None:
        if not rows:
            raise DatasetError("no prompt rows: an empty dataset has no data order")
        self.rows = rows
        self.shuffle = shuffle
        self.seed = seed
        self._rng = random.Random(seed)
        self._orders: list[list[int]] = []
        """Epoch -> row indices, generated in epoch order (the generator's state moves on with them)."""

    def __len__(self) -> int:
        return len(self.rows)

    def at(self, position: int) -> tuple[PromptRow, int]:
        if position < 0:
            raise ValueError(f"data position {position} < 0")
        epoch, i = divmod(position, len(self.rows))
        while len(self._orders) <= epoch:
            order = list(range(len(self.rows)))
            if self.shuffle:
                self._rng.shuffle(order)
            self._orders.append(order)
        return self.rows[self._orders[epoch][i]], epoch
