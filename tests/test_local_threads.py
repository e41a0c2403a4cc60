"""How many threads the local model's server runs: every core reads the prompt; generation gets
the cores the load average leaves idle (bench/README.md, section 13, for why), or what
TURNLOG_LOCAL_THREADS says."""

from __future__ import annotations

import pytest

from turnlog.engine.errors import ConfigurationError
from turnlog.local_model import THREADS_ENV, choose_threads


@pytest.mark.parametrize(
    ("cores", "load", "generate"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 3.0, 1), (2, 11.0, 1), (8, 2.0, 6), (8, 0.0, 8), (1, 0.0, 1)],
)
def test_generation_gets_the_idle_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, load: float, generate: int
) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    threads = choose_threads(cores, load)
    assert (threads.generate, threads.prompt) == (generate, cores)
    assert f"{cores} cores, load average {load:.1f}" in threads.describe()


def test_the_environment_sets_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "1")
    threads = choose_threads(2, 0.0)
    assert (threads.generate, threads.prompt) == (1, 1) and "TURNLOG_LOCAL_THREADS=1" in threads.describe()


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_setting_says_what_is_expected(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(ConfigurationError, match="TURNLOG_LOCAL_THREADS must be a whole number of threads"):
        choose_threads(2, 0.0)
