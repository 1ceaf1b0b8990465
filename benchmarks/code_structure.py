"""How the package is put together, in figures a refactoring can be held to: lines per unit, the import
cycles between units, the training loop's collaborators and length, the longest functions, and the functions
that take the whole config. Read from the source with `ast` (nothing is imported), so it runs on any
checkout: compare two commits side by side.

    python benchmarks/code_structure.py                          # this checkout
    python benchmarks/code_structure.py --root=/tmp/old --root=.  # two checkouts, one column each

Definitions:
- unit: a folder of `resnet_scaling/` or a top-level module (as tests/project/test_imports.py counts cycles);
- the loop: the function of `trainer.py` holding the `for step in ...` loop; its collaborators are the
  distinct names it calls a method on (`clock.start()`) or calls (`train_step_fn(...)`), other than
  modules, builtins and the logger;
- whole config: a parameter annotated `ml_collections.ConfigDict` (or `ConfigDict`).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import collections
import json
import sys
from pathlib import Path
from typing import Any

NOT_COLLABORATORS = set(dir(builtins)) | {"log", "logger", "self"}


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _takes_whole_config(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
    return any(a.annotation is not None and ast.unparse(a.annotation).split(".")[-1].strip("'\"") ==
               "ConfigDict" for a in arguments)


def _imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def loop_figures(trainer: Path) -> dict[str, Any]:
    """The training loop's function, length and collaborators (see the module docstring)."""
    tree = ast.parse(trainer.read_text())
    modules = _imported_names(tree)
    loops = [f for f in _functions(tree)
             if any(isinstance(n, ast.For) and "step" in ast.unparse(n.target) for n in ast.walk(f))]
    if not loops:
        return {"loop_function": None, "loop_lines": None, "collaborators": []}
    loop = min(loops, key=_lines)  # The innermost function that holds it.
    names = set()
    for node in ast.walk(loop):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        while isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
            target = target.value
        base = (target.value if isinstance(target, ast.Attribute) else target)
        if isinstance(base, ast.Name) and base.id not in modules and base.id not in NOT_COLLABORATORS:
            names.add(base.id)
    classes = {c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    defined = {f.name for f in _functions(tree)} | classes
    return {"loop_function": loop.name, "loop_lines": _lines(loop),
            "collaborators": sorted(names - defined)}


def unit_of(path: Path, package: Path) -> str:
    parts = path.relative_to(package).parts
    return f"{parts[0]}/" if len(parts) > 1 else parts[0]


def import_cycles(root: Path) -> list[list[str]]:
    """The cycles between units, by tests/project/test_imports.py's reading of the checkout at `root`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "project"))
    import test_imports  # The test's own graph: one definition of "cycle between units".

    suite_package = test_imports.PACKAGE
    test_imports.PACKAGE = root / "resnet_scaling"  # The test reads the package it names here.
    try:
        edges, _ = test_imports.import_graph()
    finally:
        test_imports.PACKAGE = suite_package
    return [sorted(c) for c in test_imports.strongly_connected_components(edges)]


def figures(root: Path) -> dict[str, Any]:
    """Every figure of the module docstring for the checkout at `root`."""
    package = root / "resnet_scaling"
    lines_per_unit: dict[str, int] = collections.Counter()
    whole_config, longest = [], []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        lines_per_unit[unit_of(path, package)] += len(text.splitlines())
        tree = ast.parse(text)
        name = str(path.relative_to(root))
        whole_config += [f"{name}:{f.name}" for f in _functions(tree) if _takes_whole_config(f)]
        longest += [(_lines(f), f"{name}:{f.name}") for f in _functions(tree)]
    folders = {u: n for u, n in sorted(lines_per_unit.items()) if u.endswith("/")}
    top_level = sum(n for u, n in lines_per_unit.items() if not u.endswith("/"))
    trainer_functions = sorted(((n, f) for n, f in longest if f.split(":")[0].endswith("/trainer.py")),
                               reverse=True)
    return {
        "root": str(root),
        "lines_per_folder": folders | {"top-level modules": top_level},
        "lines_total": sum(lines_per_unit.values()),
        "import_cycles": import_cycles(root),
        # The loop's module: at the top (before #53's folders) or in training/.
        **loop_figures(next((p for p in (package / "training" / "trainer.py", package / "trainer.py")
                             if p.is_file()), package / "trainer.py")),
        "longest_trainer_function": trainer_functions[0] if trainer_functions else None,
        "longest_functions": sorted(longest, reverse=True)[:5],
        "whole_config_functions": whole_config,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", type=Path,
                        help="a checkout (repeat to compare); default: this one")
    parser.add_argument("--json_out", type=Path, default=None,
                        help="also write the figures there (benchmarks/results/code_structure.json holds the "
                        "ones benchmarks/README.md quotes)")
    args = parser.parse_args()
    roots = [r.resolve() for r in (args.root or [Path(__file__).resolve().parents[1]])]
    results = [figures(r) for r in roots]
    rows = [("import cycles between units", lambda r: str(len(r["import_cycles"]))),
            ("the loop's function (lines)", lambda r: f"{r['loop_function']} ({r['loop_lines']})"),
            ("the loop's collaborators", lambda r: str(len(r["collaborators"]))),
            ("longest function in trainer.py", lambda r: "{1} ({0})".format(*r["longest_trainer_function"])
             .split(":")[-1]),
            ("functions taking the whole config", lambda r: str(len(r["whole_config_functions"]))),
            ("lines in resnet_scaling/", lambda r: f"{r['lines_total']:,}")]
    folders = sorted({f for r in results for f in r["lines_per_folder"]})
    rows += [(f"lines: {f}", lambda r, f=f: f"{r['lines_per_folder'].get(f, 0):,}") for f in folders]
    print("| figure | " + " | ".join(str(r) for r in roots) + " |")
    print("|---|" + "---|" * len(roots))
    for label, value in rows:
        print(f"| {label} | " + " | ".join(value(r) for r in results) + " |")
    for r in results:
        print(f"\n{r['root']}: the loop's collaborators: {', '.join(r['collaborators'])}")
    if args.json_out is not None:  # Only when asked: the default would overwrite the tracked figures.
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nWrote {args.json_out}")


if __name__ == "__main__":
    main()
