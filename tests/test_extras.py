"""The extras are decided in one place (engine/extras.py) from turnlog's own metadata: it agrees
with pyproject.toml, and its install hint matches how turnlog is installed. What a command says
without an extra is checked on a real install without it (scripts/wheel.sh)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from turnlog.engine import extras
from turnlog.engine.errors import ConfigurationError

REPO = Path(__file__).resolve().parent.parent
DEVELOPER_EXTRAS = {"test", "docs", "docker"}


def declared() -> dict[str, list[str]]:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name: [re.split(r"[=<>\[ ;]", r)[0].lower() for r in reqs] for name, reqs in optional.items()}


def test_every_user_extra_has_a_purpose_and_its_pyproject_packages() -> None:
    user = {name for name in declared() if name not in DEVELOPER_EXTRAS}
    assert user == set(extras.PURPOSES)
    for name in user:
        assert list(extras.requirements_of(name)) == [extras._normal(d) for d in declared()[name]], name


def test_this_checkout_has_every_extra_it_tests_with() -> None:
    for name in extras.PURPOSES:
        assert extras.present(name), extras.missing_note(name)


def test_the_install_hint_names_the_editable_checkout_even_from_inside_it() -> None:
    """From the checkout's own folder the first turnlog metadata found is setuptools'
    turnlog.egg-info (no direct_url.json); the hint must still be the editable one."""
    probe = (
        "import sys; sys.path.insert(0, ''); from turnlog.engine import extras; "
        "print(extras.install_command('memory'))"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "pip install -e '.[memory]'"


def test_an_unknown_extra_is_a_configuration_error() -> None:
    with pytest.raises(
        ConfigurationError, match="turnlog has no extra 'nope'; the extras are gateway, memory, local"
    ):
        extras.status("nope")
