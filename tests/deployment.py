"""Helpers for tests that run turnlog's programs as a deployment does: separate processes
(`turnlog serve`, `turnlog worker`, `turnlog projector`) started with the CLI, a key file, and
readiness checks that wait for what they need with a bound and a message."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from turnlog.gateway.auth import hash_key

REPO = Path(__file__).resolve().parent.parent


def write_keys(path: Path, keys: dict[str, tuple[str, str]]) -> None:
    """A key file for ``{user: (clear key, role)}`` (what `turnlog add-key` writes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            f'[[keys]]\nuser = "{user}"\nrole = "{role}"\nsha256 = "{hash_key(key)}"\n\n'
            for user, (key, role) in keys.items()
        )
    )


def program_env(**extra: str) -> dict[str, str]:
    """The environment of a turnlog program: this checkout importable, no model endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNLOG_", "OPENAI_"))}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "200", **extra}


@dataclass
class Program:
    """A `turnlog ...` process whose output goes to a file (shown when a check fails)."""

    name: str
    args: list[str]
    out: Path
    env: dict[str, str] = field(default_factory=program_env)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Program:
        with self.out.open("ab") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "turnlog", *self.args],
                stdout=sink, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
            )  # fmt: skip
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.out.read_text(errors="replace")[-4000:] if self.out.exists() else ""

    def check_alive(self) -> None:
        if not self.alive():
            raise AssertionError(
                f"{self.name} exited ({self.proc and self.proc.returncode}):\n{self.output()}"
            )

    def kill(self) -> None:
        """SIGKILL: no clean-up, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM and wait (then SIGKILL): a clean stop."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


async def wait_answering(url: str, key: str, program: Program, timeout_s: float = 90.0) -> None:
    """Wait until the gateway at ``url`` answers an authenticated request."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while time.monotonic() < deadline:
            program.check_alive()
            try:
                response = await client.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"})
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(
        f"{program.name} did not answer at {url} within {timeout_s:g} s:\n{program.output()}"
    )
