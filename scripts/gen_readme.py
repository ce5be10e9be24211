"""Regenerates the README's generated sections (collectors, metric reference) from the code.

Run `.venv/bin/python scripts/gen_readme.py`; `tests/test_readme.py` fails while the README is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed

from kvscope.agent.app.wiring import build_catalogue, components  # noqa: E402


def collectors_table() -> str:
    parts = components()
    rows = ["| name | flag | on by default | what it reads or computes |", "|---|---|---|---|"]
    for kind, specs in (("collector", parts.collectors), ("analysis", parts.analyses)):
        for name, spec in specs.items():
            default = "yes" if spec.enabled_by_default else "no"
            rows.append(f"| `{name}` | `--{kind}.{name}` | {default} | {spec.description} |")
    return "\n".join(rows) + "\n"


def render(readme: str) -> str:
    sections = {"collectors": collectors_table(), "metrics": build_catalogue().markdown()}
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no <!-- {name}:begin/end --> markers")
        readme = pattern.sub(lambda m, b=body: m.group(1) + b + m.group(2), readme)
    return readme


def main() -> None:
    path = ROOT / "README.md"
    path.write_text(render(path.read_text()))


if __name__ == "__main__":
    main()
