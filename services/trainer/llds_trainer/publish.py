"""Weight publishing: a Hugging Face safetensors folder per version, marker last, replicas notified.

Contract (docs/CONTRACTS.md): ``{weights_root}/v{v:06d}/`` holds ``model.safetensors`` (or, past the
shard size, ``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json``),
``config.json`` and the tokenizer files; ``COMPLETE`` (JSON ``{version, step, files: {name:
sha256}}``) is written last. Then ``llds:<run_id>:trainer:version`` is set and every rollout replica
(registered in ``llds:<run_id>:rollout:replicas``, plus configured URLs) gets ``POST /admin/weights``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llds_proto.admin_auth import signed
from llds_proto.messages import WeightUpdateNotice
from llds_server.settings import redact_url

log = logging.getLogger("llds.trainer.publish")

MARKER = "COMPLETE"
_VERSION_DIR = re.compile(r"^v(\d{6})$")


class PublishError(RuntimeError):
    """A weights folder could not be written."""


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_published(weights_root: str | Path, version: int) -> bool:
    return (Path(weights_root) / version_dir_name(version) / MARKER).is_file()


def newest_published(weights_root: str | Path) -> int:
    """Highest version with a ``COMPLETE`` marker under ``weights_root``; 0 if none."""
    root = Path(weights_root)
    if not root.is_dir():
        return 0
    found = [
        int(m.group(1))
        for p in root.iterdir()
        if (m := _VERSION_DIR.match(p.name)) and (p / MARKER).is_file()
    ]
    return max(found, default=0)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_folder(
    model: Any,
    tokenizer: Any,
    weights_root: str | Path,
    version: int,
    step: int,
    keep: int,
    max_shard_mb: int = 5000,
    state_dict: dict[str, Any] | None = None,
    keep_every: int = 0,
    pinned: set[int] | None = None,
) -> Path:
    """Write version ``version`` of the policy; returns its folder. Marker last, then old versions GC'd.

    Args:
        model: a transformers ``PreTrainedModel`` (``save_pretrained`` with safetensors).
        tokenizer: its tokenizer (``save_pretrained``), so the folder loads on its own.
        weights_root: parent folder of all versions.
        version: the version number (>= 1).
        step: trainer step that produced the weights (recorded in the marker).
        keep: versions kept; older ``vNNNNNN`` folders are deleted.
        max_shard_mb: largest safetensors file; a bigger model is written as shards plus an index.
        state_dict: the tensors to write instead of ``model``'s own (a sharded model's, gathered to
            this rank by ``Trainer.published_state``); tied names share one tensor.
        keep_every: also keep every version whose step is a multiple of this (0: none); see
            :func:`gc_versions`.
        pinned: versions a replica is reading now (kept by :func:`gc_versions`).
    """
    root = Path(weights_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / version_dir_name(version)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        model.save_pretrained(
            tmp, safe_serialization=True, max_shard_size=f"{max_shard_mb}MB", state_dict=state_dict
        )
        tokenizer.save_pretrained(tmp)
        files = {}
        for f in sorted(tmp.iterdir()):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
                files[f.name] = sha256_file(f)
        if final.exists():
            # A folder without a marker is a crashed earlier attempt at this same version.
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PublishError(f"cannot write weights version {version} under {root}: {e}") from e
    marker_tmp = final / f".{MARKER}.tmp"
    marker_tmp.write_text(json.dumps({"version": version, "step": step, "files": files}))
    with open(marker_tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(marker_tmp, final / MARKER)
    _fsync(final)
    _fsync(root)
    gc_versions(root, keep, keep_every, pinned)
    return final


def marker_step(folder: Path) -> int | None:
    """The trainer step recorded in a complete version's marker (None: no readable marker)."""
    try:
        return int(json.loads((folder / MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def gc_versions(
    weights_root: Path, keep: int, keep_every: int = 0, pinned: set[int] | None = None
) -> list[Path]:
    """Delete all but the newest ``keep`` complete versions, every version folder without its marker
    and every temp folder; returns what went. With ``keep_every`` > 0 a complete version whose marker
    names a step that is a multiple of it stays too: the checkpoints a study evaluates afterwards
    (``keep_versions_every``). A complete version in ``pinned`` stays as well: a replica is reading
    it (``RunKeys.weight_pins``), and deleting files under a reading engine mixes its weights.

    Call only while no publish is in flight (after one, or at start-up): the trainer is the only
    writer of ``weights_root``, so a temp folder or a folder without ``COMPLETE`` then is a crashed
    attempt, which no rollout loads and the next publish of that number would replace anyway.
    """
    if not weights_root.is_dir():
        return []
    versions = sorted(
        (int(m.group(1)), p)
        for p in weights_root.iterdir()
        if (m := _VERSION_DIR.match(p.name)) and p.is_dir()
    )
    complete = [p for _, p in versions if (p / MARKER).is_file()]
    old = complete[:-keep]
    if keep_every > 0:
        old = [p for p in old if (step := marker_step(p)) is None or step % keep_every != 0]
    if pinned:
        old = [p for p in old if int(p.name[1:]) not in pinned]
    gone = [p for _, p in versions if not (p / MARKER).is_file()] + old
    gone.extend(p for p in weights_root.glob(".v*") if re.match(r"^\.v(\d{6})\.", p.name))
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def host_allowed(url: str, patterns: list[str]) -> bool:
    """Whether ``url``'s host matches one of ``patterns`` (``replica_hosts``): ``*``, a host name
    glob, an address, or a network in CIDR form. Names are matched as written, never resolved."""
    import fnmatch
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return False
    if not host:
        return False
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for p in patterns:
        p = p.strip().lower()
        if "/" in p and addr is not None:
            try:
                if addr in ipaddress.ip_network(p, strict=False):
                    return True
            except ValueError:
                continue
        elif addr is not None and "*" not in p:
            try:
                if addr == ipaddress.ip_address(p):
                    return True
            except ValueError:
                continue
        elif fnmatch.fnmatchcase(host, p):
            return True
    return False


@dataclass(frozen=True)
class NotifyResult:
    url: str
    ok: bool
    detail: str


def notify_replicas(
    urls: list[str], notice: WeightUpdateNotice, token: str | None, timeout_s: float
) -> list[NotifyResult]:
    """POST the notice to every replica's ``/admin/weights``, all at once (one slow or dead replica
    costs at most ``timeout_s``, not that times the replicas); failures are returned, not raised.
    Each request is signed for its own URL with ``token`` (:mod:`llds_proto.admin_auth`); the token
    itself is never sent."""
    from concurrent.futures import ThreadPoolExecutor

    body = notice.model_dump(mode="json")

    def one(client: httpx.Client, url: str) -> NotifyResult:
        target = url.rstrip("/") + "/admin/weights"
        try:
            content, headers = signed(token, "POST", target, body)
            r = client.post(target, content=content, headers=headers)
            return NotifyResult(url, r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}")
        except httpx.HTTPError as e:
            return NotifyResult(url, False, f"{type(e).__name__}: {e}")

    if not urls:
        return []
    with httpx.Client(timeout=timeout_s) as client, ThreadPoolExecutor(min(len(urls), 32)) as pool:
        out = list(pool.map(lambda u: one(client, u), urls))
    for res in out:
        if res.ok:
            log.info("notified %s of version %d", redact_url(res.url), notice.version)
        else:
            log.warning("notify %s of version %d failed: %s", redact_url(res.url), notice.version, res.detail)
    return out
