"""``llds data fetch``: download a published data set into one folder, resumably and checked.

    llds data fetch search-r1 --out /data/search-r1    # everything: ~80 GB when done, ~145 GB at the peak
    llds data fetch search-r1 --only train eval        # the questions alone, into data/search-r1
    llds data fetch --list                             # the data sets, their parts and sources

``search-r1`` is what Search-R1 (Jin et al., 2025) trains and evaluates on, from the Hugging Face
repositories its scripts name:

- ``train``: ``PeterJinGo/nq_hotpotqa_train`` ``train.parquet`` (NQ + HotpotQA training questions)
  and ``test.parquet`` (the seven evaluation sets merged, one ``data_source`` per row), from the
  Hugging Face collection the Search-R1 README links as its data; made by its
  ``scripts/nq_hotpotqa/data_process.sh`` (``qa_search_train_merge.py`` over ``nq,hotpotqa``,
  ``qa_search_test_merge.py`` over the seven).
  Both are also written as JSONL (what ``llds rollout serve --dataset`` reads).
- ``eval``: the seven evaluation sets as FlashRAG publishes them (``RUC-NLPIR/FlashRAG_datasets``,
  ``{id, question, golden_answers, metadata}`` per line): NQ, TriviaQA, PopQA and Bamboogle test,
  HotpotQA, 2WikiMultihopQA and MuSiQue dev: the split ``qa_search_test_merge.py`` takes (test if
  there is one, else dev).
- ``corpus``: ``PeterJinGo/wiki-18-corpus`` ``wiki-18.jsonl.gz``, decompressed.
- ``index``: ``PeterJinGo/wiki-18-e5-index`` ``part_aa`` + ``part_ab``, concatenated into
  ``e5_Flat.index`` (intfloat/e5-base-v2 vectors, row i = corpus line i); the corpus and index
  repositories and file names are those of Search-R1's ``scripts/download.py``, the joining and
  decompressing those of its README's quick start.

Every download goes to ``FILE.part`` and resumes from its size with an HTTP Range request (a server
that ignores Range answers 200 and the file restarts from byte 0); dropped connections are retried.
A finished file is checked before it is renamed into place: its size against the server's, its
sha256 against one pinned in the manifest and against the one the server states (Hugging Face gives
a Git LFS file's sha256 in ``X-Linked-Etag``, a plain git file's blob sha1 in ``ETag``). A file that
fails a check is deleted and the fetch stops with the URL and both values. The sha256 of every file
(downloaded or made) goes into ``OUT/fetch.lock.json``; a later fetch re-hashes what is there
against it (``--quick``: size and modification time only) and downloads nothing that verifies.

``--base-url`` (or ``LLDS_DATA_BASE_URL``, else ``HF_ENDPOINT``) points every source at another
host that serves the same ``/datasets/REPO/resolve/REVISION/PATH`` URLs: a mirror, or the test's
loopback server. ``HF_TOKEN``, if set, is sent to that host (not to the hosts it redirects to).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote, urljoin

import httpx
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

DEFAULT_ENDPOINT = "https://huggingface.co"
BASE_URL_ENV = "LLDS_DATA_BASE_URL"
"""Environment variable that points every source at another host (``--base-url`` wins over it)."""
SKIP_SPACE_ENV = "LLDS_DATA_SKIP_SPACE_CHECK"
"""Set to skip the free-disk checks (for file systems that misreport free space)."""
LOCK_NAME = "fetch.lock.json"
LOCK_FORMAT = 1
CHUNK_BYTES = 1 << 20
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
"""HTTP statuses worth retrying (with backoff); any other non-2xx status stops the fetch."""


class FetchError(RuntimeError):
    """A download, check or conversion that failed; the message names the URL or file and the cause."""


class ChecksumError(FetchError):
    """A file whose size or digest differs from what the server, the manifest or the lock file says."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class RemoteFile(_Model):
    """One file of a Hugging Face repository and where it lands."""

    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    """Repository id, ``owner/name``."""
    path: str
    """Path of the file inside the repository."""
    dest: str
    """Where the file goes, relative to the output folder."""
    repo_type: Literal["dataset", "model"] = "dataset"
    """Kind of repository (datasets live under ``/datasets/`` in the URL)."""
    revision: str = "main"
    """Branch, tag or commit to resolve."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """Pinned sha256 of the file; None: only the server's own checksum (if any) and size apply."""

    def url(self, base: str) -> str:
        kind = "datasets/" if self.repo_type == "dataset" else ""
        return (
            f"{base.rstrip('/')}/{kind}{self.repo}/resolve/{quote(self.revision, safe='')}/{quote(self.path)}"
        )


class _OneFileStep(_Model):
    """A step that turns one file into another."""

    src: str
    """Input file (parquet, gzip), relative to the output folder."""
    dst: str
    """File written, relative to the output folder."""

    def inputs(self) -> list[str]:
        return [self.src]


class ParquetToJsonl(_OneFileStep):
    """Write every row of a parquet file as one JSON object per line (the parquet file stays)."""

    type: Literal["parquet_to_jsonl"] = "parquet_to_jsonl"

    def consumes(self) -> bool:
        return False

    def make(self, out: Path, tmp: Path, progress: bool) -> None:
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # a dependency of the project; missing only in a broken install
            raise FetchError(f"converting {self.src} needs pyarrow (pip install pyarrow)") from e
        src = pq.ParquetFile(out / self.src)
        with (
            tmp.open("w", encoding="utf-8") as f,
            _bar(src.metadata.num_rows, f"{self.dst}", progress, "rows") as bar,
        ):
            for batch in src.iter_batches(batch_size=8192):
                for row in batch.to_pylist():
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                bar.update(batch.num_rows)


class Gunzip(_OneFileStep):
    """Decompress a ``.gz`` file (which is deleted once the result is recorded)."""

    type: Literal["gunzip"] = "gunzip"

    def consumes(self) -> bool:
        return True

    def make(self, out: Path, tmp: Path, progress: bool) -> None:
        src = out / self.src
        with src.open("rb") as raw, gzip.open(raw) as z, tmp.open("wb") as f:
            with _bar(src.stat().st_size, f"gunzip {self.dst}", progress) as bar:
                done = 0
                while chunk := z.read(CHUNK_BYTES):
                    f.write(chunk)
                    bar.update(raw.tell() - done)
                    done = raw.tell()


class Concat(_Model):
    """Concatenate files in order (the parts are deleted once the result is recorded)."""

    type: Literal["concat"] = "concat"
    srcs: list[str] = Field(min_length=1)
    """Files to join, in order, relative to the output folder."""
    dst: str
    """Joined file, relative to the output folder."""

    def inputs(self) -> list[str]:
        return list(self.srcs)

    def consumes(self) -> bool:
        return True

    def make(self, out: Path, tmp: Path, progress: bool) -> None:
        total = sum((out / s).stat().st_size for s in self.srcs)
        _require_space(tmp.parent, total, f"joining {self.dst}")
        with tmp.open("wb") as f, _bar(total, f"join {self.dst}", progress) as bar:
            for s in self.srcs:
                with (out / s).open("rb") as part:
                    while chunk := part.read(CHUNK_BYTES):
                        f.write(chunk)
                        bar.update(len(chunk))


Step = Annotated[ParquetToJsonl | Gunzip | Concat, Field(discriminator="type")]


class Part(_Model):
    """A piece of a data set that ``--only`` can pick: files to download, then steps that turn them
    into what is used."""

    name: str
    """Name given to ``--only``."""
    about: str
    """One line for ``--list``."""
    files: list[RemoteFile] = Field(min_length=1)
    """What to download."""
    steps: list[Step] = []
    """Post-processing, in order."""

    def products(self) -> list[str]:
        """What is left when the part is done: step results, and downloads no step consumes."""
        consumed = {s for step in self.steps if step.consumes() for s in step.inputs()}
        return [f.dest for f in self.files if f.dest not in consumed] + [step.dst for step in self.steps]


class DataSet(_Model):
    """A named bundle of parts (``llds data fetch NAME``)."""

    name: str
    """Name given to ``llds data fetch``."""
    about: str
    """One line for ``--list``."""
    parts: list[Part] = Field(min_length=1)
    """Its parts, fetched in this order."""


def _flashrag(name: str, split: str) -> RemoteFile:
    return RemoteFile(
        repo="RUC-NLPIR/FlashRAG_datasets", path=f"{name}/{split}.jsonl", dest=f"eval/{name}.jsonl"
    )


SEARCH_R1_EVAL = (
    ("nq", "test"),
    ("triviaqa", "test"),
    ("popqa", "test"),
    ("hotpotqa", "dev"),
    ("2wikimultihopqa", "dev"),
    ("musique", "dev"),
    ("bamboogle", "test"),
)
"""The seven evaluation sets of Search-R1's results table, in its column order, and the FlashRAG
split each is evaluated on."""

SEARCH_R1 = DataSet(
    name="search-r1",
    about="Search-R1's training questions, its seven evaluation sets, the wiki-18 corpus and e5 flat index",
    parts=[
        Part(
            name="train",
            about="NQ + HotpotQA training questions and the merged seven-set test file (parquet + JSONL)",
            files=[
                RemoteFile(repo="PeterJinGo/nq_hotpotqa_train", path=f"{s}.parquet", dest=f"nq_hotpotqa_train/{s}.parquet")
                for s in ("train", "test")
            ],
            steps=[
                ParquetToJsonl(src=f"nq_hotpotqa_train/{s}.parquet", dst=f"nq_hotpotqa_train/{s}.jsonl")
                for s in ("train", "test")
            ],
        ),
        Part(
            name="eval",
            about="NQ, TriviaQA, PopQA, HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle (FlashRAG JSONL)",
            files=[_flashrag(name, split) for name, split in SEARCH_R1_EVAL],
        ),
        Part(
            name="corpus",
            about="wiki-18: 21,015,324 Wikipedia passages of 100 words (JSONL, ~14 GB)",
            files=[RemoteFile(repo="PeterJinGo/wiki-18-corpus", path="wiki-18.jsonl.gz", dest="wiki18/wiki-18.jsonl.gz")],
            steps=[Gunzip(src="wiki18/wiki-18.jsonl.gz", dst="wiki18/wiki-18.jsonl")],
        ),
        Part(
            name="index",
            about="e5-base-v2 flat FAISS index of wiki-18 (two parts joined, ~65 GB)",
            files=[
                RemoteFile(repo="PeterJinGo/wiki-18-e5-index", path=p, dest=f"wiki18/{p}")
                for p in ("part_aa", "part_ab")
            ],
            steps=[Concat(srcs=["wiki18/part_aa", "wiki18/part_ab"], dst="wiki18/e5_Flat.index")],
        ),
    ],
)  # fmt: skip

CATALOG: dict[str, DataSet] = {SEARCH_R1.name: SEARCH_R1}
"""The data sets ``llds data fetch`` knows, by name."""


def default_base_url() -> str:
    """``$LLDS_DATA_BASE_URL``, else ``$HF_ENDPOINT`` (Hugging Face's own mirror setting), else the hub."""
    return os.environ.get(BASE_URL_ENV) or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


@dataclass
class Remote:
    """What the server says about a file before it is downloaded."""

    url: str
    size: int | None = None
    sha256: str | None = None
    """A Git LFS file's sha256 (``X-Linked-Etag``, or an ``ETag`` of 64 hex digits)."""
    git_sha1: str | None = None
    """A plain git file's blob id (an ``ETag`` of 40 hex digits)."""
    commit: str | None = None
    """``X-Repo-Commit``: the commit the revision resolved to."""


@dataclass
class Outcome:
    """One line of the summary."""

    path: str
    action: str
    size: int
    checks: str


@dataclass
class Lock:
    """``OUT/fetch.lock.json``: what each finished file was checked against and its sha256."""

    path: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, out: Path) -> Lock:
        path = out / LOCK_NAME
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise FetchError(f"{path} is not valid JSON ({e}); move it away to fetch afresh") from e
        if data.get("format") != LOCK_FORMAT:
            raise FetchError(f"{path}: format {data.get('format')!r}, this version reads {LOCK_FORMAT}")
        return cls(path, dict(data["files"]))

    def record(self, rel: str, file: Path, sha256: str, **info: Any) -> None:
        st = file.stat()
        self.files[rel] = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, **info,
                           "recorded_at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
        self.save()

    def mark_removed(self, rel: str, because: str) -> None:
        if rel in self.files:
            self.files[rel]["removed"] = f"after making {because}"
            self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(
            json.dumps({"format": LOCK_FORMAT, "files": self.files}, indent=2, sort_keys=True) + "\n"
        )
        os.replace(tmp, self.path)


def _bar(total: int | None, desc: str, progress: bool, unit: str = "B") -> tqdm:
    byte_units = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, leave=False, **byte_units)


def sha256_file(path: Path, progress: bool = False) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as f, _bar(path.stat().st_size, f"sha256 {path.name}", progress) as bar:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file's bytes (what Hugging Face serves as a plain file's ``ETag``)."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def _require_space(folder: Path, need: int, what: str) -> None:
    if os.environ.get(SKIP_SPACE_ENV):
        return
    free = shutil.disk_usage(folder).free
    if free < need:
        raise FetchError(
            f"{what} needs {need / 2**30:.1f} GiB in {folder}, which has {free / 2**30:.1f} GiB free "
            f"(set {SKIP_SPACE_ENV}=1 to try anyway)"
        )


def _etag(value: str | None) -> str | None:
    if not value:
        return None
    v = value.strip()
    if v.startswith("W/"):
        v = v[2:]
    return v.strip('"').lower()


def _is_hex(value: str | None, n: int) -> bool:
    return value is not None and len(value) == n and all(c in "0123456789abcdef" for c in value)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


class Fetcher:
    """Fetch parts of a data set into ``out``: download, check, post-process, record in the lock."""

    def __init__(
        self,
        out: Path,
        base_url: str,
        *,
        retries: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        quick: bool = False,
        adopt: bool = False,
        progress: bool = True,
    ):
        self.out = out
        self.base_url = base_url
        self.retries, self.backoff_s = retries, backoff_s
        self.quick, self.adopt, self.progress = quick, adopt, progress
        headers = {"User-Agent": "llds-data-fetch", "Accept-Encoding": "identity"}
        token = os.environ.get("HF_TOKEN")
        if token:  # httpx drops Authorization when a redirect leaves this origin
            headers["Authorization"] = f"Bearer {token}"
        self.client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0))
        )
        self.lock = Lock(out / LOCK_NAME)
        """Loaded by :meth:`run` once it holds the folder."""
        self.outcomes: list[Outcome] = []
        self._ok: set[str] = set()
        """Files checked or written in this run (not checked twice)."""

    def close(self) -> None:
        self.client.close()

    # -- the server's view ---------------------------------------------------------------------

    def probe(self, url: str) -> Remote:
        """Size and checksum the server states for ``url`` (a HEAD request, redirects followed by
        hand so that Hugging Face's ``X-Linked-*`` headers on the first answer are seen)."""
        remote = Remote(url)
        target = url
        for _ in range(6):
            try:
                r = self.client.head(target, follow_redirects=False)
            except httpx.TransportError as e:
                raise FetchError(f"HEAD {target}: {type(e).__name__}: {e}") from e
            remote.commit = remote.commit or r.headers.get("x-repo-commit")
            linked = _etag(r.headers.get("x-linked-etag"))
            if _is_hex(linked, 64):
                remote.sha256 = linked
                size = r.headers.get("x-linked-size")
                remote.size = int(size) if size and size.isdigit() else None
                return remote
            if r.is_redirect:
                target = urljoin(target, r.headers["location"])
                continue
            if r.status_code == 200:
                tag = _etag(r.headers.get("etag"))
                if _is_hex(tag, 64):
                    remote.sha256 = tag
                elif _is_hex(tag, 40):
                    remote.git_sha1 = tag
                size = r.headers.get("content-length")
                remote.size = int(size) if size and size.isdigit() else None
                return remote
            hint = " (set HF_TOKEN if the repository is gated)" if r.status_code in (401, 403) else ""
            raise FetchError(f"HEAD {url}: HTTP {r.status_code} {r.reason_phrase}{hint}")
        raise FetchError(f"HEAD {url}: more than 5 redirects")

    # -- one download --------------------------------------------------------------------------

    def _stream_once(self, url: str, part: Path, size: int | None) -> str:
        """One GET into ``part`` from its current size; returns how it went ('resumed' or 'downloaded')."""
        offset = part.stat().st_size if part.exists() else 0
        if size is not None and offset > size:  # not a prefix of this file
            part.unlink()
            offset = 0
        if size is not None and offset == size and offset > 0:
            return "resumed"
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        with self.client.stream("GET", url, headers=headers, follow_redirects=True) as r:
            if r.status_code in RETRY_STATUS:
                raise _Retry(f"HTTP {r.status_code} {r.reason_phrase}")
            if r.status_code == 416 and offset:
                part.unlink()  # the server has less than we hold: start over
                raise _Retry("HTTP 416 for a resumed range; restarting the file")
            if r.status_code == 206 and offset:
                start = _range_start(r.headers.get("content-range"))
                if start != offset:
                    raise FetchError(
                        f"GET {url}: asked for bytes from {offset}, got Content-Range "
                        f"{r.headers.get('content-range')!r}"
                    )
                mode, how = "ab", "resumed"
            elif r.status_code == 200:
                mode, how, offset = "wb", "downloaded", 0  # a fresh file, or a server that ignores Range
            else:
                raise FetchError(f"GET {url}: HTTP {r.status_code} {r.reason_phrase}")
            with part.open(mode) as f, _bar(size, part.name.removesuffix(".part"), self.progress) as bar:
                bar.update(offset)
                for chunk in r.iter_bytes():  # as it arrives: a cut connection keeps what came
                    f.write(chunk)
                    bar.update(len(chunk))
        got = part.stat().st_size
        if size is not None and got < size:  # a body cut short without a transport error
            raise _Retry(f"connection ended at {got} of {size} bytes")
        return how

    def download(self, file: RemoteFile) -> None:
        """Download ``file`` to its ``.part``, check it, move it into place, record it."""
        url = file.url(self.base_url)
        remote = self.probe(url)
        if file.sha256 and remote.sha256 and file.sha256 != remote.sha256:
            raise ChecksumError(
                f"{url}: the server states sha256 {remote.sha256}, the manifest pins {file.sha256}: "
                "the published file changed"
            )
        dest = self.out / file.dest
        part = dest.with_name(dest.name + ".part")
        dest.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if remote.size is not None:
            _require_space(dest.parent, max(remote.size - have, 0), f"downloading {url}")
        attempt, how = 0, "downloaded"
        while True:
            try:
                how = self._stream_once(url, part, remote.size)
                break
            except (httpx.TransportError, _Retry) as e:
                attempt += 1
                held = part.stat().st_size if part.exists() else 0
                if attempt > self.retries:
                    raise FetchError(
                        f"GET {url}: {type(e).__name__}: {e}; gave up after {self.retries} retries "
                        f"({held} bytes kept in {part}; run again to resume)"
                    ) from e
                wait = min(self.backoff_s * 2 ** (attempt - 1), 60.0)
                print(f"llds data fetch: {url}: {e}; retry {attempt}/{self.retries} in {wait:.0f} s "
                      f"from byte {held}", file=sys.stderr)  # fmt: skip
                time.sleep(wait)
        if have and how == "downloaded":
            how = "restarted (the server ignored Range)"
        elif have:
            how = f"resumed from {_human(have)}"
        if attempt:
            how += f", {attempt} retr{'y' if attempt == 1 else 'ies'}"
        checks = self._check(url, part, file, remote, delete=True)
        os.replace(part, dest)
        self.lock.record(file.dest, dest, checks.pop("sha256"), url=url, commit=remote.commit, **checks)
        self.outcomes.append(Outcome(file.dest, how, dest.stat().st_size, checks["checks"]))

    def _check(self, url: str, path: Path, file: RemoteFile, remote: Remote, delete: bool) -> dict[str, Any]:
        """Size and digests of ``path`` against the server and the manifest. A file that fails is
        deleted when ``delete`` (a fresh download: nothing half-right stays behind)."""
        got_size = path.stat().st_size
        done: list[str] = []

        def fail(what: str, expected: object, got: object) -> None:
            if delete:
                path.unlink()
            gone = "; the download was deleted" if delete else ""
            raise ChecksumError(f"{url}: {what} of {path.name} is {got}, expected {expected}{gone}")

        if remote.size is not None:
            if got_size != remote.size:
                fail("size", remote.size, got_size)
            done.append("size")
        sha = sha256_file(path, self.progress)
        if file.sha256 is not None:
            if sha != file.sha256:
                fail("sha256", f"{file.sha256} (pinned in the manifest)", sha)
            done.append("sha256 pinned")
        if remote.sha256 is not None:
            if sha != remote.sha256:
                fail("sha256", f"{remote.sha256} (stated by the server)", sha)
            done.append("sha256 from server")
        if remote.git_sha1 is not None:
            blob = git_blob_sha1(path)
            if blob != remote.git_sha1:
                fail("git blob sha1", f"{remote.git_sha1} (the server's ETag)", blob)
            done.append("git sha1 from server")
        return {"sha256": sha, "checks": ", ".join(done) or "none (the server stated no size or checksum)"}

    # -- files already there -------------------------------------------------------------------

    def verified(self, rel: str) -> bool:
        """Whether ``rel`` is there and matches its lock entry (False: absent, or not in the lock).
        A file that differs from its lock entry is an error: it changed after it was fetched."""
        if rel in self._ok:
            return True
        path = self.out / rel
        entry = self.lock.files.get(rel)
        if not path.exists() or entry is None:
            return False
        st = path.stat()
        changed = "it changed after it was fetched; delete it to fetch it again"
        if st.st_size != entry["size"]:
            raise ChecksumError(
                f"{path} has {st.st_size} bytes, {self.lock.path} recorded {entry['size']}: {changed}"
            )
        if self.quick and st.st_mtime_ns == entry["mtime_ns"]:
            self._done(rel, "kept (--quick: size and mtime match the lock)", "lock")
            return True
        sha = sha256_file(path, self.progress)
        if sha != entry["sha256"]:
            raise ChecksumError(
                f"{path}: sha256 {sha}, {self.lock.path} recorded {entry['sha256']}: {changed}"
            )
        self._done(rel, "verified (sha256 matches the lock)", "lock")
        return True

    def _done(self, rel: str, action: str, checks: str) -> None:
        self._ok.add(rel)
        self.outcomes.append(Outcome(rel, action, (self.out / rel).stat().st_size, checks))

    def _take_unrecorded(self, file: RemoteFile) -> bool:
        """A download target that is there but not in the lock (fetched by other means): recorded if
        it matches what the server states, an error naming it if it does not."""
        dest = self.out / file.dest
        if not dest.exists():
            return False
        url = file.url(self.base_url)
        remote = self.probe(url)
        unchecked = file.sha256 is None and remote.sha256 is None and remote.git_sha1 is None
        if unchecked and remote.size is None:
            raise FetchError(f"{dest} is there but not in {self.lock.path}, and {url} states no size or "
                             "checksum to check it against: move it away to fetch it")  # fmt: skip
        try:
            checks = self._check(url, dest, file, remote, delete=False)
        except ChecksumError as e:
            raise ChecksumError(f"{dest} is there but not in {self.lock.path} and differs from the "
                                f"published file ({e}): move it away to fetch it") from e  # fmt: skip
        self.lock.record(file.dest, dest, checks.pop("sha256"), url=url, commit=remote.commit, **checks)
        self._done(file.dest, "was there; matches the server", checks["checks"])
        return True

    # -- parts ---------------------------------------------------------------------------------

    def fetch_part(self, part: Part) -> None:
        """Bring every product of ``part`` into place, downloading or making only what is missing."""
        steps = {step.dst: step for step in part.steps}
        for product in part.products():
            if product in steps:
                self._make(part, steps[product])
            else:
                self._ensure(next(f for f in part.files if f.dest == product))

    def _ensure(self, file: RemoteFile) -> None:
        if not (self.verified(file.dest) or self._take_unrecorded(file)):
            self.download(file)
            self._ok.add(file.dest)

    def _make(self, part: Part, step: Step) -> None:
        if self.verified(step.dst):
            if step.consumes():  # a run stopped between recording the result and deleting its inputs
                for src in step.inputs():
                    (self.out / src).unlink(missing_ok=True)
            return
        dst = self.out / step.dst
        if dst.exists():
            if not self.adopt:
                raise FetchError(
                    f"{dst} is there but not in {self.lock.path}, and nothing can check it (it is made "
                    f"from {', '.join(step.inputs())}): move it away to make it again, or pass --adopt "
                    "to record it as it is"
                )
            self.lock.record(step.dst, dst, sha256_file(dst, self.progress), step=step.type,
                             checks="adopted: was there, not checked")  # fmt: skip
            self._done(step.dst, "adopted (--adopt: recorded as it was, not checked)", "none")
            return
        files = {f.dest: f for f in part.files}
        for src in step.inputs():
            self._ensure(files[src])
        tmp = dst.with_name(dst.name + ".partial")
        try:
            step.make(self.out, tmp, self.progress)
        except Exception as e:  # a corrupt input: name it, leave no half-written result
            tmp.unlink(missing_ok=True)
            if isinstance(e, FetchError):
                raise
            raise FetchError(
                f"making {step.dst} from {', '.join(step.inputs())}: {type(e).__name__}: {e}"
            ) from e
        sha = sha256_file(tmp, self.progress)
        os.replace(tmp, dst)
        self.lock.record(step.dst, dst, sha, step=step.type, made_from=step.inputs(), checks="made here")
        self._done(step.dst, f"made ({step.type})", "made from checked inputs")
        if step.consumes():
            for src in step.inputs():
                (self.out / src).unlink(missing_ok=True)
                self.lock.mark_removed(src, step.dst)

    def run(self, dataset: DataSet, only: list[str] | None = None) -> list[Outcome]:
        """Fetch ``only`` these parts of ``dataset`` (all if None); returns the summary lines."""
        names = [p.name for p in dataset.parts]
        unknown = [n for n in only or [] if n not in names]
        if unknown:
            raise FetchError(
                f"{dataset.name} has no part {', '.join(map(repr, unknown))}; parts: {', '.join(names)}"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / ".fetch.busy").open("a") as busy:
            try:
                fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                raise FetchError(f"another llds data fetch is writing {self.out}; wait for it") from e
            self.lock = Lock.load(self.out)  # as the previous holder left it
            for part in dataset.parts:
                if only is None or part.name in only:
                    self.fetch_part(part)
        return self.outcomes


class _Retry(Exception):
    """A response worth retrying (a 5xx, a body cut short)."""


def _range_start(content_range: str | None) -> int | None:
    # "bytes START-END/TOTAL"
    if not content_range or not content_range.startswith("bytes "):
        return None
    head = content_range[6:].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def fetch(
    name: str,
    out: Path,
    only: list[str] | None = None,
    base_url: str | None = None,
    **options: Any,
) -> list[Outcome]:
    """Fetch data set ``name`` (a key of :data:`CATALOG`) into ``out``; see the module docstring."""
    if name not in CATALOG:
        raise FetchError(f"no data set {name!r}; known: {', '.join(CATALOG)}")
    fetcher = Fetcher(out, base_url or default_base_url(), **options)
    try:
        return fetcher.run(CATALOG[name], only)
    finally:
        fetcher.close()


def summary(outcomes: list[Outcome], out: Path) -> str:
    """The one-screen table printed at the end."""
    width = max([len(o.path) for o in outcomes] + [4])
    lines = [f"{'file':<{width}}  {'size':>10}  what happened; checks"]
    lines += [f"{o.path:<{width}}  {_human(o.size):>10}  {o.action}; {o.checks}" for o in outcomes]
    lines.append(f"lock: {out / LOCK_NAME}")
    return "\n".join(lines)


def listing() -> str:
    """``--list``: every data set, its parts and where each file comes from."""
    lines = []
    for ds in CATALOG.values():
        lines.append(f"{ds.name}: {ds.about}")
        for part in ds.parts:
            lines.append(f"  {part.name}: {part.about}")
            for f in part.files:
                lines.append(f"    {f.repo}:{f.path} -> {f.dest}")
            for step in part.steps:
                lines.append(f"    {step.type}: {', '.join(step.inputs())} -> {step.dst}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llds data fetch", description=__doc__.split("\n\n")[0])
    p.add_argument("name", nargs="?", help=f"data set to fetch: {', '.join(CATALOG)}")
    p.add_argument("--out", type=Path, help="output folder (default: data/NAME)")
    p.add_argument("--only", nargs="+", metavar="PART", help="fetch only these parts (see --list)")
    p.add_argument(
        "--base-url",
        help=f"host serving /datasets/REPO/resolve/REV/PATH (default: ${BASE_URL_ENV}, else $HF_ENDPOINT, "
        f"else {DEFAULT_ENDPOINT})",
    )
    p.add_argument("--list", action="store_true", help="print the data sets, their parts and sources")
    p.add_argument("--retries", type=int, default=5, help="retries of a dropped or failed download")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a retry")
    p.add_argument(
        "--quick",
        action="store_true",
        help="check finished files by size and modification time against the lock instead of re-hashing",
    )
    p.add_argument(
        "--adopt",
        action="store_true",
        help="record made files (JSONL, joined index) that are there but not in the lock as they are",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    if args.name is None:
        p.error(f"name a data set ({', '.join(CATALOG)}) or pass --list")
    if args.retries < 0 or args.timeout <= 0:
        p.error(f"--retries ({args.retries}) must be >= 0 and --timeout ({args.timeout}) > 0")
    out = args.out or Path("data") / args.name
    t0 = time.monotonic()
    try:
        outcomes = fetch(args.name, out, args.only, args.base_url, retries=args.retries, timeout_s=args.timeout,
                         quick=args.quick, adopt=args.adopt, progress=not args.no_progress)  # fmt: skip
    except FetchError as e:
        print(f"llds data fetch: {e}", file=sys.stderr)
        return 1
    print(summary(outcomes, out))
    print(f"done in {time.monotonic() - t0:.0f} s: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
