#!/usr/bin/env python3
"""Import circles between the modules of a Rust crate (default: passes/src).

Reads every `.rs` file below the folder, takes the module paths it names in code (`crate::a::b`,
`super::x`, and a parent's relative `child::item`; doc comments and `#[cfg(test)] mod tests`
are left out) as edges between modules (one module = one file), and prints every strongly
connected component of more than one module. Components that are a parent module and its own
children (helpers in a `mod.rs` its children use) are listed as such; any other component is a
layering error and the exit status is 1.

For passes/src it also checks the two folder rules of ARCHITECTURE.md: a module of `transforms`
imports only `transforms` (the IR -> IR transforms sit below the cost model), and only
`graphpipe` itself and the crate root import `graphpipe` (GraphPipe's IR passes sit above the
planners). A violation is printed as `LAYER:` and also makes the exit status 1.

Usage: python3 scripts/import_cycles.py [SRC_DIR]
"""
import os
import re
import sys

sys.setrecursionlimit(100000)


def modules(root):
    files = {}
    for base, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".rs"):
                p = os.path.relpath(os.path.join(base, f), root)
                mod = p[:-3].replace(os.sep + "mod", "").replace(os.sep, "::")
                files["" if mod == "lib" else mod] = open(os.path.join(base, f)).read()
    return files


def code(src):
    src = re.split(r"#\[cfg\(test\)\]\s*mod tests", src)[0]
    return "\n".join(l for l in src.split("\n") if not l.lstrip().startswith("//"))


def edges_of(files):
    mods = set(files)

    def target(path):
        parts = path.split("::")
        for i in range(len(parts), 0, -1):
            m = "::".join(parts[:i])
            if m in mods:
                return m
        return None

    edges = {m: set() for m in mods}
    for m, src in files.items():
        body = code(src)
        for u in re.findall(r"crate::([A-Za-z_][A-Za-z0-9_:]*)", body):
            t = target(u)
            if t and t != m:
                edges[m].add(t)
        parent = "::".join(m.split("::")[:-1])
        for u in re.findall(r"super::([A-Za-z_][A-Za-z0-9_:]*)", body):
            t = target(parent + "::" + u if parent else u)
            if t and t != m:
                edges[m].add(t)
        prefix = m + "::" if m else ""
        for k in mods:
            if k != m and k.startswith(prefix) and "::" not in k[len(prefix):]:
                if re.search(r"(?<![A-Za-z0-9_:])" + k.split("::")[-1] + r"::", body):
                    edges[m].add(k)
    return edges


def components(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "passes", "src")
    files = modules(root)
    edges = edges_of(files)
    bad = 0
    for comp in components(edges):
        top = min(comp, key=len)
        family = all(m == top or m.startswith(top + "::") for m in comp)
        kind = "parent and children" if family else "CIRCLE"
        bad += not family
        print(f"{kind}: {', '.join(comp)}")
        for m in comp:
            print(f"    {m or 'lib'} -> {', '.join(sorted(e for e in edges[m] if e in comp))}")
    print(f"{len(files)} modules, {sum(len(e) for e in edges.values())} edges, {bad} circles "
          "between modules that are not parent and children")
    layer = 0
    if "transforms" in edges and "graphpipe" in edges:
        def under(m, top):
            return m == top or m.startswith(top + "::")
        for m in sorted(edges):
            for e in sorted(edges[m]):
                if under(m, "transforms") and not under(e, "transforms"):
                    print(f"LAYER: {m} (a transform) imports {e}")
                    layer += 1
                if under(e, "graphpipe") and not under(m, "graphpipe") and m != "":
                    print(f"LAYER: {m} imports {e} (GraphPipe's passes sit above it)")
                    layer += 1
        print(f"{layer} layer violations")
    return 1 if bad or layer else 0


if __name__ == "__main__":
    sys.exit(main())
