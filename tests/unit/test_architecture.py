"""The package's layers import one way: io, metrics <- model <- inference <- tasks <- pipelines <- cli.

Read from the source with the ast module, so that an import against the direction, a cycle between
modules or an import hidden in a function body (the usual way to dodge a cycle) fails CI.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "indeed_cli"
LAYERS = {"version": 0, "io": 0, "metrics": 0, "model": 1, "inference": 2, "tasks": 3, "pipelines": 4, "cli": 5}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported indeed_cli module, at module level?) for every import statement of a file."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    top_level = {id(n) for n in tree.body} | {id(n) for s in tree.body if isinstance(s, ast.If) for n in s.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]  # a module or a name in one: resolve() decides
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(n, id(node) in top_level) for n in names if n == "indeed_cli" or n.startswith("indeed_cli.")]
    return out


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 and parts[1] != "__main__" else None


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_layer_table_covers_the_package():
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in SOURCES}
    assert tops - {"__init__", "__main__"} == set(LAYERS)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_one_way_and_at_module_level(path):
    me = module_name(path)
    for target, at_top in imports(path):
        assert at_top, f"{me} imports {target} inside a function: import it at the top (no cycle dodging)"
        if layer(me) is None:  # the package facade and __main__ may import anything
            continue
        assert target != "indeed_cli", f"{me} imports the package facade; import the module it needs"
        assert layer(target) is not None and layer(target) <= layer(me), (
            f"{me} (layer {layer(me)}) imports {target} (layer {layer(target)}): against the direction"
        )


def test_no_import_cycles_between_modules():
    known = {module_name(p) for p in SOURCES}

    def resolve(name: str) -> str:
        while name not in known:  # "indeed_cli.model.InDeed" -> "indeed_cli.model"
            name = name.rpartition(".")[0]
        return name

    graph = {module_name(p): {resolve(t) for t, _ in imports(p)} - {module_name(p)} for p in SOURCES}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
