"""The README's collector table and metric reference are generated from the code and kept in sync."""

from __future__ import annotations

import importlib.util

from testkit.paths import ROOT


def test_readme_generated_sections_are_current() -> None:
    spec = importlib.util.spec_from_file_location("gen_readme", ROOT / "scripts" / "gen_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    assert module.render(readme) == readme, "README.md is stale: run .venv/bin/python scripts/gen_readme.py"


def test_readme_shows_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.index("make run") < readme.index("## ") or readme.index("make run") < 800
    assert "make test" in readme[:1500]
