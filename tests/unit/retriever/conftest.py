"""Fixtures of the retriever unit tests: a tiny corpus and indexes built from it with the real builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOPICS = [
    ("Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("Berlin", "Berlin is the capital of Germany and its most populous city."),
    (
        "Photosynthesis",
        "Photosynthesis is how green plants turn sunlight, water and carbon dioxide into sugar.",
    ),
    ("Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
    ("Python (language)", "Python is a programming language created by Guido van Rossum."),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant."),
    ("Amazon River", "The Amazon is the largest river in South America by discharge of water."),
    ("Mozart", "Wolfgang Amadeus Mozart was a prolific composer of the Classical period."),
    ("Café au lait", "Café au lait is coffee with hot milk, served in France."),
    ("Tokyo", "Tokyo is the capital of Japan and one of the most populous cities."),
    ("DNA", "DNA carries the genetic instructions of every known living organism."),
    ("Shakespeare", "William Shakespeare wrote Hamlet, Macbeth and Romeo and Juliet."),
]


def write_corpus(path: Path, n_extra: int = 0) -> Path:
    """Corpus JSONL in the Search-R1 form; ``n_extra`` filler passages after the topics."""
    with path.open("w") as f:
        for i, (title, text) in enumerate(TOPICS):
            f.write(json.dumps({"id": f"d{i}", "contents": f'"{title}"\n{text}'}) + "\n")
        for j in range(n_extra):
            f.write(
                json.dumps({"id": f"x{j}", "contents": f'"Filler {j}"\nfiller passage number {j}'}) + "\n"
            )
    return path


@pytest.fixture(scope="session")
def corpus_writer() -> object:
    """``write_corpus`` for tests that need their own corpus."""
    return write_corpus


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 12-topic corpus."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="session")
def hybrid_index(tmp_path_factory: pytest.TempPathFactory, corpus_file: Path) -> Path:
    """A hybrid (BM25 + dense MiniLM flat) index of the 12-topic corpus, in 2 shards, 5-row chunks."""
    from llds_retriever.index import BuildOptions, build_index

    out = tmp_path_factory.mktemp("index") / "hybrid"
    build_index(
        BuildOptions(
            corpus=corpus_file, kind="hybrid", out=out, shards=2, chunk_size=5, device="cpu", progress=False
        )
    )
    return out
