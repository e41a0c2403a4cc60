"""Which engine code a benchmark measured: a content hash of engine/ + schemas/, and a
snapshot copy so that every process of one run imports the same code while the engine is
being edited."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = ("engine", "schemas")


def _files(repo: Path) -> list[Path]:
    out: list[Path] = []
    for part in PARTS:
        out += [
            p
            for p in (repo / part).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".c", ".avsc")
        ]
    return sorted(out)


def fingerprint(repo: Path = REPO) -> dict[str, object]:
    """sha256 (first 12 hex digits) over the relative paths and bytes of engine/**/*.py, the
    native writer's C source and schemas/*.avsc, plus the newest modification time among them,
    and whether the native writer is built in this copy."""
    h = hashlib.sha256()
    newest = 0.0
    files = _files(repo)
    for p in files:
        h.update(str(p.relative_to(repo)).encode() + b"\0" + p.read_bytes() + b"\0")
        newest = max(newest, p.stat().st_mtime)
    native = any((repo / "engine").glob("_avrowrite*.so"))
    digest = h.hexdigest()[:12]
    return {"sha256_12": digest, "files": len(files), "newest_mtime": newest, "native_writer": native}


def snapshot(dest: Path, repo: Path = REPO) -> dict[str, object]:
    """Copy engine/ and schemas/ into ``dest`` (put ``dest`` first on sys.path to use it)."""
    for part in PARTS:
        shutil.copytree(repo / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    info = fingerprint(dest)
    if info["sha256_12"] != fingerprint(repo)["sha256_12"]:
        raise RuntimeError("the engine changed while it was being copied; try again")
    return info
