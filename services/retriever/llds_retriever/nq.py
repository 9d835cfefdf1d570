"""Natural Questions passages from the ``bigbench`` sdist, for the retriever benchmark (evaluation only).

BIG-bench's ``contextual_parametric_knowledge_conflicts`` task holds NQ questions, each with a ~108-word
Wikipedia passage whose answer was swapped for another entity; the original answer is the
``target_scores`` key scored 0. Putting it back gives real (question, passage, answer) triples.
The task file carries the BIG-bench canary: never use these passages as training data.

The sdist (358 MB) is fetched once with ``pip download --no-deps bigbench==1.0.0`` into
``$LLDS_CACHE_DIR/downloads``; the extracted corpus and questions are cached beside it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from llds_retriever.corpus import cache_root
from llds_retriever.errors import RetrieverError

log = logging.getLogger("llds.retriever")

SDIST = "bigbench-1.0.0.tar.gz"
TASK = "bigbench/benchmark_tasks/contextual_parametric_knowledge_conflicts/task.json"


class DataError(RetrieverError):
    """The benchmark data could not be fetched or read."""


def bigbench_sdist(downloads: Path | None = None) -> Path:
    """Path of the bigbench sdist, downloading it with pip on first use."""
    downloads = downloads or cache_root() / "downloads"
    path = downloads / SDIST
    if path.exists():
        return path
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "bigbench==1.0.0", "-d", str(downloads)]
    log.info("downloading the bigbench sdist (358 MB): %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not path.exists():
        raise DataError(
            f"`{' '.join(cmd)}` did not produce {path} (pip said: {proc.stderr.strip()[-400:]}). "
            "pip >= 26.3 refuses this sdist's metadata; fetch it with an older pip, e.g. "
            f"`python -m venv /tmp/p && /tmp/p/bin/pip install pip==24.3.1 && /tmp/p/bin/pip download "
            f"--no-deps bigbench==1.0.0 -d {downloads}`"
        )
    return path


def _parse_example(ex: dict[str, Any]) -> tuple[str, str, str] | None:
    """(question, restored passage, original answer), or None if the example has another shape."""
    text = ex.get("input", "")
    scores = ex.get("target_scores", {})
    swapped = [k for k, v in scores.items() if v == 1]
    original = [k for k, v in scores.items() if v == 0]
    if "Question:" not in text or "\nContext:" not in text or len(swapped) != 1 or len(original) != 1:
        return None
    question, _, context = text.partition("\nContext:")
    question = question.split("Question:", 1)[1].strip()
    passage = context.strip().replace(swapped[0], original[0])
    return question, passage, original[0]


def load_nq(root: Path | None = None) -> tuple[Path, Path]:
    """(corpus.jsonl, questions.jsonl) of the NQ benchmark set, extracted once into the cache.

    Questions are ``{"id", "question", "golden_answers", "gold_id"}``; ``gold_id`` is the id of the
    passage that answers it. Passages are ``{"id", "contents": "\\"\\"\\n<passage>"}`` (no title known).
    """
    out = (root or cache_root()) / "retriever" / "nq"
    corpus, questions, done = out / "corpus.jsonl", out / "questions.jsonl", out / ".complete"
    if done.exists():
        return corpus, questions
    sdist = bigbench_sdist()
    try:
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(TASK))
            f = tar.extractfile(member)
            assert f is not None
            task = json.load(f)
    except (tarfile.TarError, StopIteration, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {TASK} from {sdist}: {e}") from e
    out.mkdir(parents=True, exist_ok=True)
    ids: dict[str, str] = {}
    n_q = 0
    with (out / ".corpus.tmp").open("w") as fc, (out / ".questions.tmp").open("w") as fq:
        for ex in task["examples"]:
            parsed = _parse_example(ex)
            if parsed is None:
                continue
            question, passage, answer = parsed
            if passage not in ids:
                ids[passage] = f"nq{len(ids)}"
                row = {"id": ids[passage], "contents": '""\n' + passage}
                fc.write(json.dumps(row, ensure_ascii=False) + "\n")
            q = {"id": f"q{n_q}", "question": question, "golden_answers": [answer], "gold_id": ids[passage]}
            fq.write(json.dumps(q, ensure_ascii=False) + "\n")
            n_q += 1
    os.replace(out / ".corpus.tmp", corpus)
    os.replace(out / ".questions.tmp", questions)
    done.write_text(f"{len(ids)} passages, {n_q} questions\n")
    log.info("NQ benchmark set: %d passages, %d questions in %s", len(ids), n_q, out)
    return corpus, questions
