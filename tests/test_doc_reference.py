"""Every public name has a reference entry with its docstring: the names of the public
``__all__`` lists are each declared (``::: module.Name``) on a page of docs/reference/python/,
and what the site renders for each (griffe, as mkdocstrings reads it) has a docstring."""

from __future__ import annotations

import importlib
import re

import griffe

from tests.doc_blocks import ROOT

PUBLIC = ("turnlog.engine", "turnlog.gateway", "turnlog.projections", "turnlog.consumers", "turnlog")
_ENTRY = re.compile(r"^::: ([\w.]+)", re.M)


def declared() -> set[str]:
    pages = (ROOT / "docs" / "reference" / "python").glob("*.md")
    return {name for page in pages for name in _ENTRY.findall(page.read_text(encoding="utf-8"))}


def test_every_public_name_has_a_reference_entry() -> None:
    entries = declared()
    missing = []
    for module_name in PUBLIC:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            # turnlog re-exports the engine's names: their entry is the engine's
            homes = {f"{module_name}.{name}", f"turnlog.engine.{name}"} if module_name == "turnlog" else {
                f"{module_name}.{name}"
            }
            if not homes & entries:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"add '::: NAME' to a page of docs/reference/python/ for: {', '.join(missing)}"


def test_every_reference_entry_has_a_docstring() -> None:
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    package = loader.load("turnlog")
    loader.resolve_aliases(implicit=False, external=False)
    bare = []
    for entry in sorted(declared()):
        found = package[entry.removeprefix("turnlog.")]
        target = found.final_target if found.is_alias else found
        if target.docstring is None or not target.docstring.value.strip():
            bare.append(entry)
    assert not bare, f"give these a docstring (the reference shows it): {', '.join(bare)}"
