"""Which engine code a benchmark measured: a content hash of engine/ + schemas/, and a
snapshot copy so that every process of one run imports the same code while the engine is
being edited."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = ("engine", "schemas")


def _files(root: Path) -> list[Path]:
    out: list[Path] = []
    for part in PARTS:
        out += [
            p
            for p in (root / part).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".avsc")
        ]
    return sorted(out)


def _root(path: Path) -> Path:
    """Where ``engine/`` and ``schemas/`` are: the repository, or a snapshot's ``turnlog/``."""
    return path if (path / "engine").is_dir() else path / "turnlog"


def fingerprint(path: Path = REPO) -> dict[str, object]:
    """sha256 (first 12 hex digits) over the relative paths and bytes of engine/**/*.py and
    schemas/*.avsc, plus the newest modification time among them."""
    root = _root(path)
    h = hashlib.sha256()
    newest = 0.0
    files = _files(root)
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
        newest = max(newest, p.stat().st_mtime)
    return {"sha256_12": h.hexdigest()[:12], "files": len(files), "newest_mtime": newest}


def snapshot(dest: Path, repo: Path = REPO) -> dict[str, object]:
    """Copy the ``turnlog`` package's __init__, engine/ and schemas/ into ``dest/turnlog`` (put
    ``dest`` first on sys.path to import ``turnlog.engine`` from it)."""
    package = dest / "turnlog"
    package.mkdir(parents=True)
    shutil.copy2(repo / "turnlog" / "__init__.py", package / "__init__.py")
    for part in PARTS:
        shutil.copytree(repo / part, package / part, ignore=shutil.ignore_patterns("__pycache__"))
    info = fingerprint(dest)
    if info["sha256_12"] != fingerprint(repo)["sha256_12"]:
        raise RuntimeError("the engine changed while it was being copied; try again")
    return info
