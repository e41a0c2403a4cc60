"""Check an installed turnlog as a user meets it (run by scripts/wheel.sh with a venv's Python).

    python smoke_install.py EXTRAS WORKDIR

EXTRAS is what the venv was installed with ("" or "gateway" or "gateway,memory"). Uses only the
standard library and the venv's `turnlog` command, from WORKDIR (never the repository, whose
folders would shadow the installed package). Exits 1 with what went wrong.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

BIN = Path(sys.executable).parent
AGENT = "logistics-assistant"
TASK = "Find last week's orders with logistics anomalies and notify each customer."
PACKAGE_DATA = (
    "turnlog/schemas/Envelope.avsc",
    "turnlog/schemas/UserMessageReceived.avsc",
    "turnlog/engine/log/events-1.zdict",
    "turnlog/gateway/viewer.html",
    "turnlog/examples/logistics/data.json",
)


def fail(message: str) -> None:
    print(f"smoke: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def turnlog(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNLOG_", "OPENAI_", "PYTHON"))}
    env["COLUMNS"] = "400"  # one finding, one line
    return subprocess.run(
        [str(BIN / "turnlog"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def expect(run: subprocess.CompletedProcess[str], code: int, what: str) -> str:
    out = run.stdout + run.stderr
    if run.returncode != code or "Traceback" in out:
        fail(f"{what}: exit {run.returncode} (wanted {code})\n{out[-4000:]}")
    return out


def check_top_level() -> None:
    """Only turnlog (and its metadata) at the top of site-packages."""
    files = metadata.files("turnlog") or []
    top = {f.parts[0] for f in files if f.parts and f.parts[0] != ".."}
    extra = {name for name in top if name != "turnlog" and not name.endswith(".dist-info")}
    if extra or "turnlog" not in top:
        fail(f"the wheel installs {sorted(top)} at the top of site-packages; only turnlog belongs there")
    shipped = {"/".join(f.parts) for f in files}
    for data in PACKAGE_DATA:
        if data not in shipped:
            fail(f"the wheel lacks its package data {data}")
    history = [f for f in files if f.parts[:3] == ("turnlog", "schemas", "history") and f.suffix == ".json"]
    if len(history) < 30:
        fail(f"the wheel holds {len(history)} schemas of the schema history under turnlog/schemas/history")


def check_commands(extras: set[str], work: Path) -> None:
    version = expect(turnlog("--version", cwd=work), 0, "turnlog --version")
    if not version.startswith("turnlog "):
        fail(f"turnlog --version said {version!r}")
    doctor = expect(turnlog("doctor", "--home", str(work / "doctor"), cwd=work), 0, "turnlog doctor")
    for extra in ("gateway", "memory"):
        wanted = "on:" if extra in extras else f"off: .*pip install 'turnlog\\[{extra}\\]'"
        line = next((ln for ln in doctor.splitlines() if f"extra {extra}:" in ln), "")
        if not re.search(wanted, line):
            fail(f"turnlog doctor says {line!r} of the {extra} extra")
    demo = expect(turnlog("demo", "--scripted", "--home", str(work / "demo"), cwd=work), 0, "demo")
    if "finished: answered" not in demo:
        fail(f"turnlog demo --scripted did not answer:\n{demo[-3000:]}")
    if "memory" not in extras and "long-term memory is off" not in demo:
        fail("turnlog demo without the memory extra should say in one line that memory is off")


def check_serve(extras: set[str], work: Path) -> None:
    home = work / "serve"
    if "gateway" not in extras:
        for command in ("add-key", "serve"):
            args = (command, "alice") if command == "add-key" else (command,)
            said = expect(turnlog(*args, "--home", str(home), cwd=work, timeout=60), 2, command)
            if "pip install 'turnlog[gateway]'" not in said:
                fail(f"turnlog {command} without the gateway extra should say how to install it:\n{said}")
        return
    added = expect(turnlog("add-key", "alice", "--home", str(home), cwd=work), 0, "add-key")
    key = added.strip().splitlines()[-1]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNLOG_", "OPENAI_", "PYTHON"))}
    with (work / "serve.out").open("w") as output:
        proc = subprocess.Popen(
            [str(BIN / "turnlog"), "serve", "--home", str(home), "--port", str(port)],
            cwd=work, env=env, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _answer_one_message(f"http://127.0.0.1:{port}", key, proc)
    except BaseException:
        print((work / "serve.out").read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _answer_one_message(url: str, key: str, proc: subprocess.Popen[bytes]) -> None:
    _wait(lambda: _call(f"{url}/readyz")[0] == 200, proc, "turnlog serve to be ready")
    auth = {"Authorization": f"Bearer {key}"}
    status, created = _call(f"{url}/v1/sessions", {"agent": AGENT}, auth)
    if status != 201:
        fail(f"creating a session answered {status}: {created}")
    sid = created["session_id"]
    status, posted = _call(f"{url}/v1/sessions/{sid}/messages", {"text": TASK}, auth)
    if status != 202:
        fail(f"posting a message answered {status}: {posted}")

    def answered() -> bool:
        status, session = _call(f"{url}/v1/sessions/{sid}", headers=auth)
        return status == 200 and session["turns"] == 1 and session["current_state"] == "FINISHED"

    _wait(answered, proc, "the message to be answered")


def _call(
    url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, ConnectionError):
        return 0, {}


def _wait(
    condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float = 180
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"turnlog serve exited ({proc.returncode}) while waiting for {what}")
        if condition():
            return
        time.sleep(0.2)
    fail(f"waited {timeout:g} s for {what}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    extras = {e for e in sys.argv[1].split(",") if e}
    work = Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    check_top_level()
    check_commands(extras, work)
    check_serve(extras, work)
    print(f"smoke: ok: Python {sys.version.split()[0]}, extras [{','.join(sorted(extras)) or 'none'}]")


if __name__ == "__main__":
    main()
