"""Convert a parquet file of Search-R1 questions to the JSONL the rollout reads, row by row.

Search-R1 publishes its training questions as parquet; the rollout's dataset loader reads JSONL.
Needs pyarrow (download_dataset.sh installs it into a temporary folder if it is missing).

    python3 deploy/scripts/parquet_to_jsonl.py train.parquet train.jsonl
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """numpy / arrow scalars and arrays as JSON-serialisable Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def convert(src: Path, dst: Path, batch_rows: int = 8192) -> int:
    """Write every row of ``src`` as one JSON object per line of ``dst`` (atomically); returns the count."""
    import pyarrow.parquet as pq

    tmp = dst.with_name(dst.name + ".partial")
    rows = 0
    with tmp.open("w") as out:
        for batch in pq.ParquetFile(src).iter_batches(batch_size=batch_rows):
            for row in batch.to_pylist():
                out.write(json.dumps(_plain(row), ensure_ascii=False) + "\n")
                rows += 1
    os.replace(tmp, dst)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: parquet_to_jsonl.py SRC.parquet DST.jsonl", file=sys.stderr)
        return 2
    n = convert(Path(argv[0]), Path(argv[1]))
    print(f"{argv[1]}: {n} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
