"""The pipeline's imports point one way, the path of a file says its layer, and every file has one name.

Layers are folders (architecture §2): a module's layer is read off its path, never off a list of names.
The AST of each module is walked for every `kvscope.*` import, at module level and inside functions, and
each must point at a layer its own may use. The one-identity rule: nothing in the package, the tests,
the benches or the scripts imports a package folder by its bare name (`agent.…`, `collectors.…`), and
the suite cannot make those names importable. A last test runs the sidecar's path in a fresh interpreter
and checks what it actually imported.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import kvscope
from testkit.package_tree import module_name, package_dirs, package_files
from testkit.paths import ROOT

# the folders the import names live in, as the wheel is built: agent, collectors, dashboards, exporters, package
BARE = tuple(sorted(set(package_dirs().values())))

# path prefix (in the tree) -> layer; the longest prefix wins
LAYERS = {
    "package": "root",
    "package/__main__.py": "composition",
    "agent/__init__.py": "core",
    "agent/core": "core",
    "agent/config": "base",
    "agent/http": "base",
    "agent/runtime": "base",
    "collectors": "collector",
    "agent/analyses": "analysis",
    "exporters": "sink",
    "dashboards": "dashboards",
    "agent/app": "composition",
    "agent/tools": "tools",
}

# layer -> the layers it may import
ALLOWED = {
    "root": {"root"},
    "core": {"core", "root"},
    "base": {"core", "base", "root"},
    "collector": {"core", "base", "collector", "root"},
    "analysis": {"core", "base", "analysis", "root"},
    "sink": {"core", "base", "analysis", "sink", "root"},
    "dashboards": {"core", "dashboards", "root"},
    "composition": {"core", "base", "collector", "analysis", "sink", "composition", "root"},
    "tools": {"core", "base", "collector", "analysis", "sink", "composition", "tools", "root"},
}
TOOLS_PREFIX = "kvscope.agent.tools"


def layer_of_path(rel: str) -> str | None:
    best = max((prefix for prefix in LAYERS if rel == prefix or rel.startswith(prefix + "/")), key=len, default=None)
    return None if best is None else LAYERS[best]


def modules() -> dict[str, Path]:
    """Every module of the package, by its one import name."""
    return {module_name(wheel_path): path for wheel_path, path in package_files().items()}


def layer(module: str, known: dict[str, Path]) -> str | None:
    path = known.get(module)
    return None if path is None else layer_of_path(path.relative_to(ROOT).as_posix())


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every kvscope module `path` imports; `from kvscope.x import y` counts y when y is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "kvscope"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvscope":
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
    return found


def bare_imports_of(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of a package folder by its bare name (`agent.core.store`), which only works from the tree."""
    wrong = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        wrong += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names if name.split(".")[0] in BARE]
    return wrong


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(str(p.relative_to(ROOT)) for p in modules().values()
                      if layer_of_path(p.relative_to(ROOT).as_posix()) is None)
    assert not unplaced, f"give these folders a layer in LAYERS ({Path(__file__).name}): {unplaced}"


def test_imports_point_one_way() -> None:
    known = modules()
    wrong = []
    for name, path in sorted(known.items()):
        own = layer(name, known)
        assert own is not None
        for target in sorted(imports_of(path, set(known))):
            target_layer = layer(target, known)
            if target_layer not in ALLOWED[own]:
                wrong.append(f"{name} ({own}) imports {target} ({target_layer})")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_wrong_direction(tmp_path: Path) -> None:
    """The walk finds an import inside a function, the kind a careless fix would add, and the layer of a
    module comes from its folder."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from kvscope.agent.analyses.correlation import analysis\n    return analysis\n")
    target = "kvscope.agent.analyses.correlation.analysis"
    assert imports_of(bad, {target}) == {target}
    assert layer(target, modules()) == "analysis"
    assert "analysis" not in ALLOWED["collector"]
    assert layer_of_path("collectors/new_family/new_source.py") == "collector"
    assert layer_of_path("agent/new_folder/x.py") is None


def test_no_file_imports_a_package_folder_by_its_bare_name() -> None:
    files = [p for folder in (*BARE, "tests", "bench", "scripts") for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 300
    wrong = [line for path in sorted(files) for line in bare_imports_of(path)]
    assert not wrong, "import these as kvscope.…:\n" + "\n".join(wrong)


def test_the_bare_import_checker_sees_one(tmp_path: Path) -> None:
    source = "def f():\n    import collectors.host.disk\n    from agent.core.store import Store\n"
    (tmp_path / "x.py").write_text(source)
    found = [line.split(": ")[1] for line in bare_imports_of(tmp_path / "x.py", tmp_path)]
    assert sorted(found) == ["agent.core.store", "collectors.host.disk"]


def test_the_suite_cannot_import_the_folders_by_their_bare_names() -> None:
    """Neither this process (pytest, importlib mode, tests/lib on the path) nor a child started from the
    repository root, as tests start `kvscope run` and `python -c`, can import `agent` and the others."""
    assert [name for name in BARE if importlib.util.find_spec(name) is not None] == []
    probe = f"import importlib.util; print([n for n in {list(BARE)!r} if importlib.util.find_spec(n)])"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (found.returncode, found.stdout.strip()) == (0, "[]"), found.stdout + found.stderr
    # and the package runs from there by its one name
    version = subprocess.run([sys.executable, "-m", "kvscope", "version"], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
    assert (version.returncode, version.stdout.strip()) == (0, f"kvscope {kvscope.__version__}"), version.stderr


def test_one_file_one_module() -> None:
    """The module kvscope's code runs is the file in the tree (installed editable: a link to it; from a
    wheel: a copy of it), by one name."""
    import kvscope.agent.core.store as store

    path, tree = Path(store.__file__), ROOT / "agent" / "core" / "store.py"
    assert path.resolve() == tree.resolve() or (path.parts[-4:] == ("kvscope", "agent", "core", "store.py")
                                                 and path.read_bytes() == tree.read_bytes())
    assert [name for name in sys.modules if name.split(".")[0] in BARE] == []


SIDECAR = """
import sys
from kvscope.agent.app.cli import build_parser
from kvscope.agent.config.settings import load_config
from kvscope.agent.app.wiring import build_agent, components
build_parser(["run"])
config = load_config("[exporters.prometheus]\\nlisten = '127.0.0.1:0'\\n", components(), environ={})
agent = build_agent(config)
agent.start()
agent.stop()
print("\\n".join(sorted(m for m in sys.modules if m.startswith("kvscope"))))
"""


@pytest.mark.integration
def test_the_sidecar_path_loads_no_reference_selftest_or_analyze() -> None:
    proc = subprocess.run([sys.executable, "-c", SIDECAR], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.split()
    assert "kvscope.agent.analyses.correlation.analysis" in loaded and "kvscope.collectors.host.disk" in loaded
    assert not [m for m in loaded if m.startswith(TOOLS_PREFIX)], loaded


def test_tests_mirror_the_package_tree() -> None:
    """tests/agent/core/test_store.py tests agent/core/store.py: every folder of tests (but its helpers and
    fixtures) is a folder of the package, so a test is found where its module is."""
    folders = [p for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"
               and p.relative_to(ROOT / "tests").parts[0] not in ("lib", "fixtures")]
    assert len(folders) > 15
    orphans = [str(p.relative_to(ROOT)) for p in folders if not (ROOT / p.relative_to(ROOT / "tests")).is_dir()]
    assert orphans == []
