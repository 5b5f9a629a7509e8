"""The layers point one way (docs/architecture.md): no import cycle among fedsim/, strategies/ and
clients/ — imports inside functions included — the core imports neither Flower nor Ray, and
nothing below the runner imports the runner back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedsim", "strategies", "clients")
#: the runner layer: builds runs from configs and drives engines; only it (and the CLI) may import
#: strategies/ and clients/, and only it may import itself.
RUNNER_PACKAGE = "fedsim.runner"
#: the Flower wrapper (:mod:`fedsim.flower`) builds its DP step with the runner's builder, so it is
#: runner layer too: Flower glue for other people's apps.
RUNNER_PACKAGES = (RUNNER_PACKAGE, "fedsim.flower")
#: ``fedsim`` itself: its ``__getattr__`` loads the public API (:mod:`fedsim.api`) on first use
RUNNER = (
    "fedsim",
    "fedsim.api",
    "fedsim.cli",
    "fedsim.cli_reference",
    "fedsim.deploy.runconfig",
    "fedsim.deploy.serverapp",
)
#: Flower glue inside fedsim/ (typed record reads): may import Flower, not the runner.
FLOWER_GLUE = ("fedsim.records",)


def in_runner(module: str) -> bool:
    """Whether ``module`` belongs to the runner layer (the ``fedsim.runner`` package or a runner module)."""
    return module in RUNNER or any(module == p or module.startswith(p + ".") for p in RUNNER_PACKAGES)


#: The Flower glue: folders beside the package in the source tree, imported as ``fedsim.<name>``.
GLUE = ("strategies", "clients")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            if parts[0] in GLUE:
                parts = ("fedsim", *parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f
    return out


def is_glue(module: str) -> bool:
    """Whether ``module`` is in ``fedsim.strategies`` or ``fedsim.clients``."""
    return any(module == f"fedsim.{g}" or module.startswith(f"fedsim.{g}.") for g in GLUE)


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere in its source (a package import counts
    as an import of the package's ``__init__``)."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in mods else origin for a in node.names]
            for t in targets:
                r = resolve(t)
                if r is not None and r != m:
                    graph[m].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_with_function_level_imports():
    graph = import_graph()
    assert len(graph) > 60
    assert cycles(graph) == []


def test_only_the_runner_imports_the_runner_strategies_and_clients():
    graph = import_graph()
    assert any(m.startswith(RUNNER_PACKAGE + ".") for m in graph)
    for m, targets in graph.items():
        if in_runner(m):
            continue
        below_runner = {t for t in targets if in_runner(t)}
        assert not below_runner, f"{m} imports the runner module(s) {sorted(below_runner)}"
        if m.startswith("fedsim.") and not is_glue(m):
            flower_side = {t for t in targets if is_glue(t)}
            assert not flower_side, f"core module {m} imports {sorted(flower_side)}"


def test_the_core_imports_without_flower_and_ray():
    """Every fedsim module except the runner and the Flower glue imports with ``flwr`` and
    ``ray`` made unimportable (in a fresh interpreter)."""
    core = sorted(
        m for m in modules() if m.startswith("fedsim") and not in_runner(m) and m not in FLOWER_GLUE and not is_glue(m)
    )
    code = (
        "import importlib, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('flwr', 'ray'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "bad = []\n"
        f"for m in {core!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError as e:\n"
        "        bad.append((m, str(e)))\n"
        "assert 'flwr' not in sys.modules and 'ray' not in sys.modules\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(core) > 50
