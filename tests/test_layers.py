"""The worker side imports one way: the contract, then the runtime (`kubetriton`), then the facade
(`pytriton`), as docs/layout.md draws it.

Every module of the worker side (`worker/`, and `sidecar/`, whose proxy model the runtime installs) is read
with `ast`, its imports at module level and inside functions alike. The check fails on a loop of imports,
on an import of `pytriton` from `kubetriton` other than the contract modules, on an import from a contract
module of anything outside the contract, and on an import inside a function that does not say why in a
comment (one placed there to get round a loop hides the loop). The checker also runs on small trees with
each fault, so that finding nothing in the real one means something.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER_SIDE = (REPO / "worker", REPO / "sidecar")
"""The source roots of the worker side: the runtime with the proxy model it installs into Triton, and the
API; below each, the path is the import path (pyproject.toml's package-dir)."""
PACKAGES = ("kubetriton", "pytriton")
CONTRACT = frozenset(
    {
        "pytriton",
        "pytriton.exceptions",
        "pytriton.model_config",
        "pytriton.model_config.common",
        "pytriton.model_config.model_config",
        "pytriton.model_config.tensor",
        "pytriton.model_config.triton_model_config",
        "pytriton.proxy",
        "pytriton.proxy.context",
        "pytriton.proxy.types",
        "pytriton.settings",
    }
)
"""What users and the runtime both need, importing nothing of the project outside this set."""


@dataclass
class Module:
    name: str
    root: Path
    path: Path
    imports: dict[str, int] = field(default_factory=dict)
    """The project modules it imports, each with the line of its first import."""
    unexplained: list[int] = field(default_factory=list)
    """The lines of its imports inside a function with no comment on the line or right above it."""


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_modules(roots: tuple[Path, ...]) -> dict[str, Module]:
    """Every module of PACKAGES below `roots`, with the project modules each imports. Importing `a.b.c`
    imports the packages `a` and `a.b` first, so each counts as imported too, except a package that holds
    the importing module (it is being imported already)."""
    modules = {
        module_name(root, path): Module(module_name(root, path), root, path)
        for root in roots
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }
    for module in modules.values():
        source = module.path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        nested = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(function)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in imported_names(module, node):
                for target in own_modules(name, modules, module.name):
                    module.imports[target] = min(node.lineno, module.imports.get(target, node.lineno))
            if id(node) in nested and not explained(lines, node):
                module.unexplained.append(node.lineno)
    return modules


def imported_names(module: Module, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement may import: each module named, and for `from X import y`,
    both X and X.y (y may be a submodule)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.name.split(".")
        if module.path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([node.module] if node.module else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def own_modules(name: str, modules: dict[str, Module], importer: str) -> list[str]:
    """The project modules that importing `name` runs: it and its packages, but the importer's own."""
    parts = name.split(".")
    prefixes = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return [
        prefix
        for prefix in prefixes
        if prefix in modules and prefix != importer and not importer.startswith(prefix + ".")
    ]


def explained(lines: list[str], node: ast.stmt) -> bool:
    """Whether a comment sits on the import's line or on the line right above it."""
    line = lines[node.lineno - 1]
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return "#" in line[node.col_offset :] or above.startswith("#")


def loops(modules: dict[str, Module]) -> list[list[str]]:
    """Each set of modules that import one another in a circle (strongly connected, Tarjan's way)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in modules[name].imports:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(modules):
        if name not in index:
            visit(name)
    return found


def violations(modules: dict[str, Module], contract: frozenset[str]) -> list[str]:
    """What breaks the layering, one line each."""
    faults = [f"import loop: {' -> '.join(component)}" for component in loops(modules)]
    for module in modules.values():
        where = module.path.relative_to(module.root)
        runtime = module.name.split(".")[0] == "kubetriton"
        for target, line in module.imports.items():
            outside = target not in contract
            if module.name in contract and outside:
                faults.append(f"{where}:{line}: the contract module {module.name} imports {target}")
            elif runtime and target.split(".")[0] == "pytriton" and outside:
                faults.append(f"{where}:{line}: the runtime module {module.name} imports {target}")
        faults += [
            f"{where}:{line}: an import inside a function says nothing of why" for line in module.unexplained
        ]
    return faults


def test_the_worker_side_imports_one_way() -> None:
    modules = read_modules(WORKER_SIDE)
    assert {"kubetriton.serving", "pytriton.triton", "pytriton.settings"} <= set(modules)
    assert set(modules) >= CONTRACT, "a contract module was renamed or removed: update CONTRACT"
    assert violations(modules, CONTRACT) == []


def write_tree(root: Path, files: dict[str, str]) -> tuple[Path, ...]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return (root,)


@pytest.mark.parametrize(
    ("files", "fault"),
    [
        pytest.param(
            {
                "kubetriton/__init__.py": "",
                "kubetriton/launcher.py": "def main():\n    from kubetriton import host  # a reason\n",
                "kubetriton/host.py": "from kubetriton.launcher import main\n",
            },
            "import loop: kubetriton.host -> kubetriton.launcher",
            id="a loop through an import inside a function",
        ),
        pytest.param(
            {
                "kubetriton/__init__.py": "",
                "kubetriton/host.py": "from pytriton.triton import Triton\n",
                "pytriton/__init__.py": "",
                "pytriton/triton.py": "from kubetriton import host\n",
            },
            "kubetriton/host.py:1: the runtime module kubetriton.host imports pytriton.triton",
            id="the runtime reaching into the facade",
        ),
        pytest.param(
            {
                "kubetriton/__init__.py": "",
                "kubetriton/podenv.py": "",
                "pytriton/__init__.py": "",
                "pytriton/settings.py": "import os\n\nfrom kubetriton import podenv\n",
            },
            "pytriton/settings.py:3: the contract module pytriton.settings imports kubetriton",
            id="the contract importing the runtime",
        ),
        pytest.param(
            {
                "pytriton/__init__.py": "",
                "pytriton/settings.py": "def parse():\n    from . import triton  # a reason\n",
                "pytriton/triton.py": "",
            },
            "pytriton/settings.py:2: the contract module pytriton.settings imports pytriton.triton",
            id="the contract importing the facade, relatively and inside a function",
        ),
        pytest.param(
            {
                "kubetriton/__init__.py": "",
                "kubetriton/host.py": "def serve():\n    import json\n    return json\n",
            },
            "kubetriton/host.py:2: an import inside a function says nothing of why",
            id="an import inside a function without its reason",
        ),
    ],
)
def test_the_check_finds_each_fault(tmp_path: Path, files: dict[str, str], fault: str) -> None:
    roots = write_tree(tmp_path, files)
    contract = frozenset({"pytriton", "pytriton.settings"})
    assert fault in violations(read_modules(roots), contract)


def test_a_submodule_importing_its_own_package_is_no_loop(tmp_path: Path) -> None:
    """`pytriton.model_config` imports its submodules, which import one another through the package:
    Python has the package in hand by then, so that is no loop."""
    roots = write_tree(
        tmp_path,
        {
            "pytriton/__init__.py": "",
            "pytriton/model_config/__init__.py": "from pytriton.model_config.tensor import Tensor\n",
            "pytriton/model_config/tensor.py": "from pytriton.model_config.common import Kind\n",
            "pytriton/model_config/common.py": "",
        },
    )
    contract = frozenset({"pytriton", "pytriton.model_config", "pytriton.model_config.tensor"})
    assert violations(read_modules(roots), contract | {"pytriton.model_config.common"}) == []
