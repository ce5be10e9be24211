"""The pipeline's imports point one way: collectors → core ← analyses ← sinks (architecture §2).

Every module of the four packages is put in a layer by its name; the AST of each is walked for every
`kvscope.*` import, at module level and inside functions, and each must point at a layer its own may
use. A new module that fits no layer fails the test until it is placed. A second test runs the
sidecar's path in a fresh interpreter and checks what it actually imported.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "collectors", "exporters", "dashboards")

CORE = {f"kvscope.agent.{name}" for name in (
    "pipeline", "readings", "records", "catalogue", "contract", "tiers", "store", "scheduler", "scheduler_jobs",
    "scheduler_threads", "config", "binding", "http_server", "http_connection", "http_messages", "basic_auth",
    "webconfig", "extras", "logs", "kv_access", "signals",
)} | {"kvscope.agent"}
COMPOSITION = {f"kvscope.agent.{name}" for name in ("wiring", "cli", "flags", "preflight")}
TOOLS = ("kvscope.agent.reference", "kvscope.agent.selftest", "kvscope.agent.analyze")

# layer -> the layers it may import
ALLOWED = {
    "core": {"core", "root"},
    "collector": {"core", "collector", "root"},
    "analysis": {"core", "analysis"},
    "sink": {"core", "analysis", "sink"},
    "dashboards": {"core", "dashboards"},
    "composition": {"core", "collector", "analysis", "sink", "composition", "root"},
    "tools": {"core", "collector", "analysis", "sink", "composition", "tools", "root"},
}


def layer(module: str) -> str | None:
    if module == "kvscope":
        return "root"
    if module in CORE:
        return "core"
    if module in COMPOSITION:
        return "composition"
    if module.startswith(TOOLS):
        return "tools"
    for prefix, name in (("kvscope.agent.correlation", "analysis"), ("kvscope.agent.whatif", "analysis"),
                         ("kvscope.collectors", "collector"),
                         ("kvscope.exporters", "sink"), ("kvscope.dashboards", "dashboards")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("kvscope", *parts))
            out[name.removesuffix(".__init__")] = path
    return out


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every kvscope module `path` imports; `from kvscope.x import y` counts y when y is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("kvscope")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvscope"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in modules() if layer(name) is None)
    assert not unplaced, f"put these modules in a layer in {Path(__file__).name}: {unplaced}"


def test_imports_point_one_way() -> None:
    known = set(modules()) | {"kvscope"}
    wrong = []
    for name, path in sorted(modules().items()):
        own = layer(name)
        assert own is not None
        for target in sorted(imports_of(path, known)):
            target_layer = layer(target)
            if target_layer not in ALLOWED[own]:
                wrong.append(f"{name} ({own}) imports {target} ({target_layer})")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_wrong_direction(tmp_path: Path) -> None:
    """The walk finds an import inside a function, the kind a careless fix would add."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from kvscope.agent.correlation import engine\n    return engine\n")
    assert imports_of(bad, {"kvscope.agent.correlation.engine"}) == {"kvscope.agent.correlation.engine"}
    assert "analysis" not in ALLOWED["collector"]


SIDECAR = """
import sys
from kvscope.agent.cli import build_parser
from kvscope.agent.config import load_config
from kvscope.agent.wiring import build_agent, components
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
    assert "kvscope.agent.correlation.engine" in loaded and "kvscope.collectors.disk" in loaded
    assert not [m for m in loaded if m.startswith(TOOLS)], loaded
