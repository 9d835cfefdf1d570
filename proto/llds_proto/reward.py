"""Answer scoring shared by rollout (training reward) and evaluation.

Exact match after SQuAD-style normalisation, as in Search-R1; F1 and substring match for
evaluation; Search-R1's format-aware reward (their v0.3) as an option.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Literal

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PUNCT = set(string.punctuation)

RewardKind = Literal["exact_match", "f1", "format"]


def normalize_answer(s: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def extract_answer(response: str) -> str | None:
    """Content of the last complete ``<answer>...</answer>`` in the response text, stripped."""
    matches = _ANSWER_RE.findall(response)
    return matches[-1].strip() if matches else None


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def substring_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 if any normalised gold answer occurs inside the normalised prediction."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(normalize_answer(g) in p for g in golds))


def f1_score(prediction: str | None, golds: Sequence[str]) -> float:
    """Best token-level F1 of the prediction against the gold answers."""
    if prediction is None:
        return 0.0
    pred_toks = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        gold_toks = normalize_answer(g).split()
        common = Counter(pred_toks) & Counter(gold_toks)
        same = sum(common.values())
        if same == 0:
            continue
        prec, rec = same / len(pred_toks), same / len(gold_toks)
        best = max(best, 2 * prec * rec / (prec + rec))
    return best


def is_well_formed(response: str) -> bool:
    """Search-R1's format check: balanced think/search/answer tags, ending with exactly one answer."""
    if len(_ANSWER_RE.findall(response)) != 1 or not response.rstrip().endswith("</answer>"):
        return False
    for tag in ("think", "search", "answer", "information"):
        if response.count(f"<{tag}>") != response.count(f"</{tag}>"):
            return False
    return True


def score_response(
    response: str, golds: Sequence[str], kind: RewardKind = "exact_match"
) -> tuple[float, float, str | None]:
    """Score a response text (not the prompt). Returns ``(reward, exact_match, answer)``."""
    answer = extract_answer(response)
    em = exact_match(answer, golds)
    if kind == "exact_match":
        return em, em, answer
    if kind == "f1":
        return f1_score(answer, golds), em, answer
    formed = is_well_formed(response)
    if em:
        reward = 1.0 if formed else 0.8
    elif formed:
        reward = 0.2
    elif answer is not None:
        reward = 0.1
    else:
        reward = 0.0
    return reward, em, answer
