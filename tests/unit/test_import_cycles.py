"""No import circle between any two modules of smartcache (issue 36): every import runs one way.

The import-linter contract "No import circles" (pyproject.toml, ``make lint``) forbids circles between
the children of each package, at every depth. It cannot see one through a package's own
``__init__`` (``pkg/__init__.py`` imports ``pkg.a``, which imports ``pkg``): this test reads the same
graph (grimp, import-linter's) and fails on any circle at all, imports under ``TYPE_CHECKING``
included, since a circle of annotations is a circle a reader has to hold in mind too.
"""

from __future__ import annotations

import grimp

PACKAGE = "smartcache"


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion),
    each sorted; a module that imports itself is no circle between modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph.find_modules_directly_imported_by(other)))))
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def one_circle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """A circle through the first module of a component, as a reader would draw it: a -> b -> ... -> a."""
    first = component[0]
    for imported in sorted(graph.find_modules_directly_imported_by(first)):
        if imported in component:
            back = graph.find_shortest_chain(importer=imported, imported=first)
            if back is not None:
                return " -> ".join((first, *back))
    return ", ".join(component)


def test_no_module_of_smartcache_is_part_of_an_import_circle() -> None:
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    found = circles(graph)
    assert not found, "import circles (make the shared piece a module below both):\n" + "\n".join(
        one_circle(graph, c) for c in found
    )


def test_the_circle_finder_finds_a_circle_through_a_package_init_and_no_other() -> None:
    """What the contract misses: a package's __init__ importing its child, which imports the package."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg", imported="pkg.a")
    graph.add_import(importer="pkg.a", imported="pkg")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.c")
    assert circles(graph) == [["pkg", "pkg.a"]]
    assert one_circle(graph, ["pkg", "pkg.a"]) == "pkg -> pkg.a -> pkg"
