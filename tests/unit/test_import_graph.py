"""No module of the server, the export tools or the client imports itself through others.

import-linter's contracts (`make check`) hold the layers and refuse circles between siblings;
this finds any circle at all among modules, a package and its own modules included (where a
package's `__init__` imports a module that imports the package back), function-level and
TYPE_CHECKING imports counted.
"""

from __future__ import annotations

import grimp


def _circles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                imported = graph.find_modules_directly_imported_by(child) & modules
                work.append((child, iter(sorted(imported))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("lmserve", include_external_packages=False)
    ours = {
        m
        for m in graph.modules
        if m.startswith(("lmserve.server", "lmserve.export", "lmserve.client"))
    }
    assert len(ours) > 250  # the whole tree was read
    assert _circles(graph, ours) == []


def test_a_circle_is_found() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p", imported="p.a")
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p")
    graph.add_import(importer="p.c", imported="p.a")
    assert _circles(graph, {"p", "p.a", "p.b", "p.c"}) == [["p", "p.a", "p.b"]]
