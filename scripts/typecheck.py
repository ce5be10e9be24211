"""mypy over the source tree under the import names the wheel gives it (`make lint` runs it).

The package folders (package/, agent/, collectors/, exporters/, dashboards/) become `kvscope.…` through
pyproject.toml's package-dir mapping, which mypy cannot read: given agent/core/store.py it would call
the module `agent.core.store`. This script reads the same mapping, hands mypy every file with its
`kvscope.…` name, and mypy checks them as sources and reports the paths an editor shows. The options
are pyproject.toml's [tool.mypy], as a plain `mypy` would take them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit.package_tree: the tree's files by import name

from testkit.package_tree import module_name, package_files  # noqa: E402

TEST_MODULES = ("testkit.nvml_replay",)  # outside the package, but scripts/gpu_check.py runs it


def package_sources() -> list[BuildSource]:
    """Every module of the mapped packages, named as installed."""
    return [BuildSource(str(path.relative_to(ROOT)), module_name(wheel_path), None)
            for wheel_path, path in sorted(package_files().items())]


def main(argv: list[str]) -> int:
    # the options from pyproject.toml; the sources are ours ("-c pass" only satisfies the parser)
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), *argv, "-c", "pass"])
    options.mypy_path = [*options.mypy_path, str(ROOT / "tests" / "lib")]
    extra = [BuildSource(f"tests/lib/{name.replace('.', '/')}.py", name, None) for name in TEST_MODULES]
    sources = package_sources() + extra
    messages: list[str] = []
    try:
        result = build.build(sources, options,
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
          f"({len(sources)} source files, {files} modules read)")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
