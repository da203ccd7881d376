"""Fails when the PyTorch adapter's modules import each other in a circle, when interpreter start
(the package and what it imports at module level) loads more than the import hook needs, or when
a module does not say in its first line what it holds.
    usage: adapter_modules.py PACKAGE_DIR | --self-test"""

import ast
import os
import sys
import tempfile

# what every Python rank process loads at interpreter start: the rest loads when torch is imported
START = {"__init__", "installation", "common"}


def imports(path, package):
    """(module level, anywhere): the package's modules a file imports."""
    top, every = set(), set()
    tree = ast.parse(open(path).read(), path)
    outer = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == package:
            names = [(node.module.split(".") + [a.name])[1] for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")]
        for name in names:
            every.add(name.split(".")[0])
            if id(node) in outer:
                top.add(name.split(".")[0])
    return top, every, tree


def check(pkg):
    package = os.path.basename(os.path.normpath(pkg))
    modules = sorted(f[:-3] for f in os.listdir(pkg) if f.endswith(".py"))
    graph, top, bad = {}, {}, []
    for m in modules:
        path = os.path.join(pkg, m + ".py")
        top[m], graph[m], tree = imports(path, package)
        graph[m].discard("__init__")
        doc = ast.get_docstring(tree, clean=False)
        first = open(path).readline()
        if doc is None or not (first.startswith('"""') and (first.rstrip().endswith('"""') or m == "__init__")):
            bad.append("%s.py: the first line is no docstring that says what the module holds" % m)
        for name in graph[m] - set(modules):
            bad.append("%s.py imports %s, which the package does not have" % (m, name))
    # a circle: depth-first search for a back edge
    state = {}

    def visit(m, trail):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                bad.append("a circle of imports: %s" % " -> ".join(trail[trail.index(n):] + [n]))
            elif n in graph and n not in state:
                visit(n, trail + [n])
        state[m] = "done"

    for m in modules:
        if m not in state:
            visit(m, [m])
    # interpreter start: the package and what it imports at module level, transitively
    loaded, todo = set(), ["__init__"]
    while todo:
        m = todo.pop()
        if m in loaded or m not in top:
            continue
        loaded.add(m)
        todo.extend(top[m])
    for m in sorted(loaded - START):
        bad.append("%s.py loads at interpreter start (every Python process pays for it): import it where it "
                   "is needed, when torch is imported" % m)
    for line in bad:
        print("adapter_modules: " + line)
    if not bad:
        print("adapter_modules: %d modules, no circle, interpreter start loads %s"
              % (len(modules), ", ".join(sorted(loaded))))
    return 1 if bad else 0


def self_test():
    cases = {
        "clean": ({"__init__": '"""p."""\nfrom .installation import x\n',
                   "installation": '"""i."""\nfrom .common import y\ndef f():\n    from . import b\n',
                   "common": '"""c."""\n', "b": '"""b."""\nfrom .common import y\n'}, 0),
        "circle": ({"__init__": '"""p."""\n', "a": '"""a."""\nfrom .b import x\n',
                    "b": '"""b."""\ndef f():\n    from . import a\n'}, 1),
        "heavy start": ({"__init__": '"""p."""\nfrom .installation import x\n',
                         "installation": '"""i."""\nfrom . import losses\n', "losses": '"""l."""\n'}, 1),
        "no docstring": ({"__init__": '"""p."""\n', "a": "import os\n"}, 1),
    }
    failed = 0
    for name, (files, want) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            pkg = os.path.join(d, "pkg")
            os.mkdir(pkg)
            for m, text in files.items():
                with open(os.path.join(pkg, m + ".py"), "w") as f:
                    f.write(text)
            if check(pkg) != want:
                print("adapter_modules: self-test %r: expected %s" % (name, "a failure" if want else "success"))
                failed = 1
    print("adapter_modules: self-test %s" % ("failed" if failed else "passed"))
    return failed


if __name__ == "__main__":
    sys.exit(self_test() if sys.argv[1:] == ["--self-test"] else check(sys.argv[1]))
