"""The package's imports flow one way: no cycle between its units (a folder is one unit, a top-level module
another), read from the source with `ast`, every `import` and `from` counted (inside functions and
`if TYPE_CHECKING:` blocks too: an import moved into a function to get around the order is still a cycle).

`resnet_scaling/__init__.py` (the public API, which imports everything) is a unit only for what names it
explicitly: importing a submodule runs it, but that is Python's loading order, not a dependency."""

import ast
import collections
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "resnet_scaling"
ROOT = "resnet_scaling"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """`resnet_scaling.data.pipeline` -> `data/`, `resnet_scaling.training.trainer` -> `trainer.py`,
    `resnet_scaling` -> `__init__.py`."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """What an import statement names: modules, or `module.name` for each name of a `from` import."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # Relative: from the module's package, one level up per extra dot.
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def _owner(name: str, modules: set[str]) -> str | None:
    """The package's module that `name` is or lives in (the longest prefix that is one), else None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """`(edges, where)`: each unit's set of units it imports, and for each edge the imports that make it
    ("path:line imports name")."""
    files = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    modules = set(files)
    edges: dict[str, set[str]] = collections.defaultdict(set)
    where: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for module, path in files.items():
        source = _unit(module)
        edges[source]  # Every unit is a node, importing anything or not.
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, module, path.name == "__init__.py"):
                owner = _owner(name, modules)
                if owner is None or _unit(owner) == source:
                    continue
                edges[source].add(_unit(owner))
                where[source, _unit(owner)].append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                                   f"imports {name}")
    return dict(edges), dict(where)


def strongly_connected_components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components of one unit without a self-loop are left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def a_cycle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's first unit: the shortest path back to it (breadth first)."""
    start = component[0]
    members = set(component)
    previous: dict[str, str] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle in {component}")


def describe_cycles(edges: dict[str, set[str]], where: dict[tuple[str, str], list[str]]) -> str:
    """Each set of units caught in cycles with one cycle through them, then every import between them (its
    first statement)."""
    lines = []
    for component in strongly_connected_components(edges):
        cycle = a_cycle(component, edges)
        lines.append(f"cycle among {', '.join(component)}: {' -> '.join(cycle)}")
        lines += [f"    {a} -> {b}: {where[a, b][0]}" for a in component for b in sorted(edges[a])
                  if b in component]
    return "\n".join(lines)


def test_the_graph_sees_the_package():
    """The parser finds the units and the imports that are plainly there (else "no cycle" means nothing)."""
    edges, where = import_graph()
    commands = {"train.py", "evaluate.py", "compile.py", "planner.py", "prepare.py"}
    folders = {"job/", "config/", "data/", "models/", "checkpointing/", "metrics/", "training/", "inference/",
               "planning/"}
    assert set(edges) == {"__init__.py"} | commands | folders, sorted(edges)
    assert edges["training/"] >= {"config/", "data/", "models/", "metrics/", "checkpointing/"}
    assert any("training/trainer.py:" in line for line in where["training/", "metrics/"])
    assert "__init__.py" not in set().union(*edges.values())  # Nothing uses the public API from inside.


# The folders in layers, as data flows (config -> plan -> mesh -> input -> model -> step -> metrics ->
# checkpoint): a folder imports only from the layers below its own. The commands sit on top.
LAYERS = (
    {"job/"},  # The process: errors, workdir, devices and mesh, signals, the job.
    {"config/"},  # The config, its recipes and the plan derived from it.
    {"data/", "models/", "checkpointing/", "metrics/"},
    {"training/"},
    {"inference/", "planning/"},
)


def test_the_folders_import_only_from_the_layers_below():
    edges, where = import_graph()
    below: set[str] = set()
    for layer in LAYERS:
        for folder in sorted(layer):
            assert edges[folder] <= below, (folder, {e: where[folder, e][0] for e in edges[folder] - below})
        below |= layer


def test_a_cycle_is_found_and_named():
    edges = {"a.py": {"b/"}, "b/": {"c.py"}, "c.py": {"a.py", "d.py"}, "d.py": set()}
    where = {("a.py", "b/"): ["x:1 imports b"], ("b/", "c.py"): ["y:2 imports c"],
             ("c.py", "a.py"): ["z:3 imports a"], ("c.py", "d.py"): ["z:4 imports d"]}
    assert strongly_connected_components(edges) == [["a.py", "b/", "c.py"]]
    assert describe_cycles(edges, where).splitlines() == [
        "cycle among a.py, b/, c.py: a.py -> b/ -> c.py -> a.py",
        "    a.py -> b/: x:1 imports b", "    b/ -> c.py: y:2 imports c", "    c.py -> a.py: z:3 imports a"]
    assert strongly_connected_components({"a.py": {"b.py"}, "b.py": set()}) == []


def test_no_import_cycle_between_the_package_units():
    edges, where = import_graph()
    cycles = describe_cycles(edges, where)
    assert not cycles, "Import cycles between the package's units:\n" + cycles


def _module_imports(module: str) -> set[str]:
    """The package's modules that `resnet_scaling.<module>` imports."""
    files = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    name = f"{ROOT}.{module}"
    path = files[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        for imported in _imported(node, name, path.name == "__init__.py"):
            owner = _owner(imported, set(files))
            if owner is not None and owner not in (name, ROOT):
                found.add(owner[len(ROOT) + 1:])
    return found


def test_the_multi_process_job_imports_nothing_of_the_library_and_the_workdir_only_the_bottom():
    """The job component (join, start-up checks, peer watch, leave) stands alone: what it needs of a run
    (the checkpoints on disk, for a dead peer's message) is handed to it. The workdir foundation (paths,
    atomic writes, the lock) sits on the errors and the lazy TensorFlow import only."""
    assert _module_imports("job.distributed") == set()
    assert _module_imports("job.workdir") <= {"job.errors", "job.tf_import"}


def test_the_loop_reports_nothing_to_the_multi_process_job():
    # The dead-peer message reads the newest checkpoint from disk: no progress side channel from the loop.
    assert (PACKAGE / "job" / "distributed.py").is_file()  # The job component exists, as a module of its own.
    metrics = [f"metrics.{p.stem}" for p in (PACKAGE / "metrics").glob("*.py") if p.stem != "__init__"]
    for module in ("training.trainer", *metrics):
        assert "job.distributed" not in _module_imports(module), module


def test_no_test_module_imports_another_test_module():
    """What tests share lives in the helper modules beside them (tests/helpers.py, tests/worker_runs.py,
    ...): a test module imported by another runs its module-level code twice and ties two files together."""
    tests = PACKAGE.parent / "tests"
    test_modules = {".".join(p.relative_to(tests.parent).with_suffix("").parts)
                    for p in tests.rglob("test_*.py")}
    imported = set()
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:  # `from tests.x import test_y` too.
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            imported |= {(path.name, name) for name in names if name in test_modules}
    assert imported == set()
