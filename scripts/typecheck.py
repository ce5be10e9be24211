"""mypy over the source tree under the import names the wheel gives it (`make lint` runs it).

The package folders (package/, agent/, collectors/, exporters/, dashboards/) become `kvscope.…` through
pyproject.toml's package-dir mapping, which mypy cannot read: given agent/core/store.py it would call
the module `agent.core.store`. This script reads the same mapping, hands mypy every file with its
`kvscope.…` name, and mypy checks them as sources and reports the paths an editor shows. The options
are pyproject.toml's [tool.mypy], as a plain `mypy` would take them.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]
TEST_MODULES = ("testkit.nvml_replay",)  # outside the package, but scripts/gpu_check.py runs it


def package_sources(root: Path = ROOT) -> list[BuildSource]:
    """Every module of the mapped packages, named as installed."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    mapping: dict[str, str] = project["tool"]["setuptools"]["package-dir"]
    sources = []
    for package, folder in sorted(mapping.items()):
        nested = [other for other in mapping.values() if other != folder]
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder)
            if any((root / folder / rel).is_relative_to(root / other) for other in nested):
                continue
            parts = [package, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            sources.append(BuildSource(str(path.relative_to(root)), ".".join(parts), None))
    return sources


def main(argv: list[str]) -> int:
    # the options from pyproject.toml; the sources are ours ("-c pass" only satisfies the parser)
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), *argv, "-c", "pass"])
    options.mypy_path = [*options.mypy_path, str(ROOT / "tests" / "lib")]
    extra = [BuildSource(f"tests/lib/{name.replace('.', '/')}.py", name, None) for name in TEST_MODULES]
    messages: list[str] = []
    try:
        result = build.build(package_sources() + extra, options,
                             flush_errors=lambda _file, new, _serious: messages.extend(new))
    except CompileError as exc:
        messages.extend(exc.messages)
        print("\n".join(messages), file=sys.stderr)
        return 2
    errors = [m for m in messages if ": error:" in m]
    if messages:
        print("\n".join(messages))
    files = len(result.files)
    print(f"{'Found ' + str(len(errors)) + ' errors' if errors else 'Success: no issues'} "
          f"({len(package_sources()) + len(extra)} source files, {files} modules read)")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
