"""The package's shape: no import circles, and no module importing one from a layer above its own.

Every import counts, lazy ones inside functions included, relative or absolute: a lazy import is
still a dependency, only a later one. The layers, bottom to top, are written down here once
(docs/architecture.md draws the same list); a module may import its own layer and the ones below.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mirror_sd", "app", "scripts", "research")

# Bottom to top. A name stands for the module and, where it is a package, everything in it;
# "mirror_sd.__init__" is the package's face alone.
LAYERS = [
    ("foundation", ["mirror_sd.errors", "mirror_sd.options", "mirror_sd.sampling", "mirror_sd.trace",
                    "mirror_sd.branches", "mirror_sd.tree_growth", "mirror_sd.tree_rules", "mirror_sd.devices",
                    "mirror_sd.executors", "mirror_sd.nvml"]),
    ("models", ["mirror_sd.models"]),
    ("drafting", ["mirror_sd.drafting"]),
    ("methods", ["mirror_sd.methods"]),
    ("engine", ["mirror_sd.engine", "mirror_sd.__init__"]),
    ("tools", ["mirror_sd.tools", "mirror_sd.train"]),
    ("cli", ["mirror_sd.cli", "mirror_sd.__main__"]),
    ("app", ["app"]),
    ("scripts and research", ["scripts", "research"]),
]


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Module name -> file, for every .py file under the packages (a package's name for its __init__.py)."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def import_graph(root: Path, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """Module -> {module of the packages it imports: the line of the first such import}. Every import
    statement counts, at any depth (functions, classes, branches); ``from X import name`` counts the
    module ``X.name`` where there is one, else ``X``; imports from outside the packages are left out."""
    files = module_files(root, packages)

    def known(name: str) -> str | None:  # the module itself, else its nearest enclosing package of ours
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else known(base)
                           for alias in node.names]
            else:
                continue
            for target in targets:
                if target and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles: each set of two or more modules that all reach one another (Tarjan's
    strongly connected components), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def one_cycle(graph: dict[str, dict[str, int]], circle: list[str]) -> list[str]:
    """One closed path through a circle's modules, first module repeated at the end (for the message)."""
    inside, start = set(circle), circle[0]
    path, seen = [start], {start}
    while True:
        nxt = next((w for w in sorted(graph[path[-1]]) if w == start and len(path) > 1), None)
        if nxt:
            return path + [start]
        step = next((w for w in sorted(graph[path[-1]]) if w in inside and w not in seen), None)
        if step is None:  # a dead end inside the circle: back up
            path.pop()
            if not path:
                return circle + [circle[0]]
            continue
        path.append(step)
        seen.add(step)


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index of the layer whose longest name covers ``module`` (the module, its __init__, or a
    package above it); None where no name does."""
    best = None
    for i, (_, names) in enumerate(layers):
        for name in names:
            covers = module in (name, name.removesuffix(".__init__")) or module.startswith(name + ".")
            if covers and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return best[0] if best else None


def upward_imports(graph: dict[str, dict[str, int]], layers=LAYERS) -> list[str]:
    """Every import of a module from a layer above the importer's, as "importer:line -> imported"."""
    wrong = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            a, b = layer_of(module, layers), layer_of(target, layers)
            if a is not None and b is not None and b > a:
                wrong.append(f"{module}:{line} ({layers[a][0]}) imports {target} ({layers[b][0]})")
    return wrong


def describe(graph, circle, files) -> str:
    cycle = one_cycle(graph, circle)
    steps = [f"{files[a].relative_to(ROOT)}:{graph[a][b]}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps) + f" -> {files[cycle[0]].relative_to(ROOT)}"


# -- the package -----------------------------------------------------------------------------------
def test_no_import_circles():
    graph, files = import_graph(ROOT), module_files(ROOT)
    found = [describe(graph, circle, files) for circle in circles(graph)]
    assert not found, "import circles (each file:line imports the next file):\n" + "\n".join(found)


def test_no_module_imports_a_layer_above_its_own():
    wrong = upward_imports(import_graph(ROOT))
    assert not wrong, "imports from a layer above (the layers are LAYERS):\n" + "\n".join(wrong)


def test_every_module_has_a_layer():
    loose = [m for m in module_files(ROOT) if layer_of(m) is None]
    assert not loose, f"modules in no layer (add them to LAYERS and docs/architecture.md): {loose}"


def test_the_architecture_page_lists_the_same_layers():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for name, modules in LAYERS:
        assert name in page, f"docs/architecture.md does not name the layer {name!r}"


def test_no_thread_state_chooses_a_kernel_in_the_models():
    """A module's kernel is an attribute set when it is loaded or a stage captures it (docs/architecture.md,
    "The model and its fast paths"), never a thread's state read during the forward: no ``threading.local``
    in models/, nor in devices.py, the lanes the models once read it from."""
    files = [*(ROOT / "mirror_sd" / "models").glob("*.py"), ROOT / "mirror_sd" / "devices.py"]
    found = [f.relative_to(ROOT) for f in files if "threading.local" in f.read_text()]
    assert not found, f"thread-local state in {found}"


# -- the checks themselves ----------------------------------------------------------------------------
def test_a_circle_and_an_upward_import_are_found_in_a_small_graph():
    graph = {"low.a": {"low.b": 1}, "low.b": {"high.c": 2}, "high.c": {"low.a": 3}, "low.d": {"low.a": 4}}
    layers = [("low", ["low"]), ("high", ["high"])]
    assert circles(graph) == [["high.c", "low.a", "low.b"]]
    assert one_cycle(graph, ["high.c", "low.a", "low.b"]) == ["high.c", "low.a", "low.b", "high.c"]
    assert upward_imports(graph, layers) == ["low.b:2 (low) imports high.c (high)"]
    del graph["high.c"]["low.a"]
    assert circles(graph) == [] and upward_imports(graph, layers)


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    """A circle made only of a lazy relative import inside a function and an absolute one."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .sub import leaf\n")
    (package / "sub" / "__init__.py").write_text("")
    lazy = "import os\n\n\ndef later():\n    from .. import top\n    from . import gone\n"  # lines 5 and 6
    (package / "sub" / "leaf.py").write_text(lazy)
    (package / "top.py").write_text("from pkg.sub.leaf import later\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": {"pkg.sub.leaf": 1}, "pkg.sub": {}, "pkg.sub.leaf": {"pkg.top": 5, "pkg.sub": 6},
                     "pkg.top": {"pkg.sub.leaf": 1}}
    assert circles(graph) == [["pkg.sub.leaf", "pkg.top"]]
