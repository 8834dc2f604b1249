"""qknorm_pipeline's modules import each other without a cycle: the graph of their imports (module
level, and with the imports deferred into functions as well), read with ast, has no circle."""
import ast
import os

from helpers import REPO

PACKAGE = "qknorm_pipeline"


def modules(root, package):
    """{dotted name: file} of every module of PACKAGE under ROOT (a package by its __init__.py)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(root, package)):
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(folder, f[:-3]), root).replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = os.path.join(folder, f)
    return out


def imports(tree, deferred):
    """The import statements of TREE: those run when the module loads (its body, inside if/try too),
    and with DEFERRED those inside functions as well."""
    if deferred:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            todo += [n for h in getattr(node, "handlers", []) for n in h.body]
    return out


def import_graph(root, package, deferred=False):
    """{module: the package's modules it imports}. `from .a import b` names module a.b where there is
    one, else a; a module's own enclosing packages are left out (they are loaded before it)."""
    mods = modules(root, package)
    graph = {}
    for name, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        here = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        targets = set()
        for node in imports(tree, deferred):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
                continue
            base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
        # `import a.b.c` names the deepest of its parts that is a module
        deepest = {next((t.rsplit(".", k)[0] for k in range(t.count(".") + 1) if t.rsplit(".", k)[0] in mods), None)
                   for t in targets}
        graph[name] = {t for t in deepest if t and t != name and not name.startswith(t + ".")}
    return graph


def cycle(graph):
    """One import circle of GRAPH as [a, b, ..., a], or None when it has none (depth-first search)."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_check_finds_a_circle_and_its_modules(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "a.py").write_text("import os\nfrom .sub.leaf import thing\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from ..b import g\n")
    (pkg / "b.py").write_text("try:\n    from pkg import a\nexcept ImportError:\n    pass\n")
    assert import_graph(str(tmp_path), "pkg") == {"pkg": set(), "pkg.sub": {"pkg.sub.leaf"}, "pkg.a": {"pkg.sub.leaf"},
                                                  "pkg.sub.leaf": set(), "pkg.b": {"pkg.a"}}
    assert cycle(import_graph(str(tmp_path), "pkg")) is None
    # the import deferred into a function closes the circle a -> sub.leaf -> b -> a
    graph = import_graph(str(tmp_path), "pkg", deferred=True)
    assert graph["pkg.sub.leaf"] == {"pkg.b"}
    assert cycle(graph) == ["pkg.a", "pkg.sub.leaf", "pkg.b", "pkg.a"]


def test_qknorm_pipeline_has_no_import_cycle():
    graph = import_graph(REPO, PACKAGE)
    assert len(graph) > 40 and "qknorm_pipeline.paths" in graph["qknorm_pipeline.recipes"]
    assert cycle(graph) is None, " -> ".join(cycle(graph))
    # nor through an import deferred into a function (recipes -> prepare -> data.stats -> recipes was one)
    deferred = import_graph(REPO, PACKAGE, deferred=True)
    assert cycle(deferred) is None, " -> ".join(cycle(deferred))
