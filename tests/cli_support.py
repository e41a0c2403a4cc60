"""The `turnlog` program as a user runs it, for the tests of its commands: a real process, the
environment's TURNLOG_ and OPENAI_ settings left out unless a test gives them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def program_env(**env: str) -> dict[str, str]:
    """A child process's environment: this one's without its TURNLOG_ and OPENAI_ settings, the
    checkout importable, wide output, and ``env`` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TURNLOG_", "OPENAI_"))}
    return {**clean, "COLUMNS": "200", "PYTHONPATH": str(REPO), **env}


def turnlog(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``turnlog ARGS --home HOME`` to its end (at most 120 s) with ``env`` added."""
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args, "--home", str(home)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=program_env(**env),
    )  # fmt: skip
