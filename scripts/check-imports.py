#!/usr/bin/env python3
"""The crates' imports, checked: inside the turbotun crate one path per module and no cycle between its folders;
in every crate, no cycle between its files.

Inside `crates/turbotun/src`, code names a module by its folder (`crate::dataplane::batch`), never by the flat
re-exports that `lib.rs` keeps for users (`crate::batch`) nor by a root re-export of an item (`crate::Queue`).
From those paths this draws the graph of the folders (`sys`, `devices`, ...; each file at the crate root, `error.rs`
and `stop.rs`, as one more node) and
fails on a cycle. `error.rs` sits below every folder but `sys`: any other module it names must be a leaf, a file
that itself names nothing of the crate but `sys` (the error types that `Error` wraps).

Only code counts: comment lines (doc links among them) are skipped, since docs link the public, flat paths.

Files, in each crate of CRATES: a file imports the files whose items its `crate::`, `super::` and `self::` paths
name (the file of the longest module the path names: `crate::devices::queue::Queue` is `devices/queue.rs`, a
`mod.rs` or a `foo.rs` beside a `foo/` folder is its module's file, `crate::Item` the crate root's), and no file
may reach itself through those imports. A re-export counts as an import of the file it names, so a type wrapped
by another file is imported from its own file (`crate::configuration::netlink::error::NetlinkError`). Unit tests
(`#[cfg(test)]` modules inside a file) do not count: like the crate's tests/ they use the code from outside, and
a test of `gro.rs` may build its packets with a helper that itself calls `gro.rs`.

    scripts/check-imports.py           check; print the folder graph
    scripts/check-imports.py --dot     the folder graph in Graphviz's dot language
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "crates" / "turbotun" / "src"
# The crates whose files may not import each other in a cycle; a new crate is one more line.
ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
CRATES = [
    "crates/turbotun-wire/src",
    "crates/turbotun/src",
    "crates/turbotun-wg/src",
    "crates/turbotun-cli/src",
    "crates/turbotun-bench/src",
]
PATH = re.compile(r"\bcrate::([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)")


def code_lines(path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.lstrip().startswith("//"):
            yield number, line


def node_of(path):
    """The folder a file belongs to, or the stem of a file at the crate root (`error`, `lib`)."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def defining_file(name):
    """The file that defines the item `name` (a struct, an enum, a trait or a type)."""
    pattern = re.compile(rf"^\s*pub(?:\([a-z]+\))?\s+(?:struct|enum|trait|type)\s+{name}\b", re.M)
    found = [p for p in SRC.rglob("*.rs") if pattern.search(p.read_text())]
    return found[0] if len(found) == 1 else None


def crate_nodes(path):
    """The first segments of the `crate::` paths a file's code names."""
    return {m.group(1).split("::")[0] for _, line in code_lines(path) for m in PATH.finditer(line)}


# --- Files: no cycle between the files of a crate -------------------------------------------------------------

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
MOD_DECL = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*;")
INLINE_MOD = re.compile(rf"^(\s*)(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*\{{\s*$")
USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+")
RELATIVE = re.compile(rf"(?<![\w:])((?:crate|super|self)(?:::{IDENT})+)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def use_paths(tree):
    """The paths a `use` tree names: `a::{b, c::{d as e}, self}` is `a::b`, `a::c::d` and `a`."""
    tree = re.sub(r"\s+", " ", tree).strip()
    start = tree.find("{")
    if start < 0:
        return [re.sub(r"\s+as\s+\w+$", "", tree)] if tree else []
    prefix = tree[:start].strip().removesuffix("::")
    depth, begin, parts = 0, start + 1, []
    for i in range(start, len(tree)):
        if tree[i] == "{":
            depth += 1
        elif tree[i] == "}":
            depth -= 1
            if depth == 0:
                parts.append(tree[begin:i])
                break
        elif tree[i] == "," and depth == 1:
            parts.append(tree[begin:i])
            begin = i + 1
    paths = []
    for part in parts:
        for path in use_paths(part):
            paths.append(prefix if path == "self" else f"{prefix}::{path}" if prefix else path)
    return paths


def crate_modules(src):
    """Module path (a tuple of names) -> the files that are that module. `lib.rs`, `main.rs` and the other top
    files no root declares (a second binary's `main`) are the crate root, `()`."""
    files = sorted(src.rglob("*.rs"))
    declared = set()
    for root in ("lib.rs", "main.rs"):
        if (src / root).exists():
            declared |= {m.group(1) for _, line in code_lines(src / root) if (m := MOD_DECL.match(line))}
    modules = defaultdict(list)
    for path in files:
        rel = path.relative_to(src)
        if len(rel.parts) == 1 and (rel.name in ("lib.rs", "main.rs") or rel.stem not in declared):
            modules[()].append(path)
        elif rel.name == "mod.rs":
            modules[rel.parent.parts].append(path)
        else:
            modules[rel.with_suffix("").parts].append(path)
    return modules


def file_imports(modules):
    """(file, file it imports) -> the line numbers of the paths that name it."""
    module_of = {f: m for m, files in modules.items() for f in files}
    imports = defaultdict(list)
    for path, here in module_of.items():
        inline = []  # the inline `mod name {` blocks the line is in: (indent, name, under cfg(test))
        statement, test_attr = None, False

        def name(target, number):
            segments = [s for s in target.split("::") if s and s != "*"]
            module = here + tuple(n for _, n, _ in inline)
            if segments[0] == "crate":
                module, segments = (), segments[1:]
            else:  # self:: and super::, from the module the line is in
                while segments and segments[0] in ("self", "super"):
                    module = module[:-1] if segments[0] == "super" else module
                    segments = segments[1:]
            full = module + tuple(segments)
            for n in range(len(full), -1, -1):
                if full[:n] in modules:
                    for other in modules[full[:n]]:
                        if other != path:
                            imports[(path, other)].append(number)
                    return

        for number, line in code_lines(path):
            line = STRING.sub('""', line)
            if m := INLINE_MOD.match(line):
                inline.append((m.group(1), m.group(2), test_attr))
                test_attr = False
                continue
            test_attr = line.strip() == "#[cfg(test)]" or (test_attr and line.strip().startswith("#["))
            if inline and line.rstrip() == inline[-1][0] + "}":
                inline.pop()
                continue
            if any(test for _, _, test in inline):
                continue
            if statement is not None or USE.match(line):
                if statement is None:
                    statement = (number, "")
                statement = (statement[0], statement[1] + " " + line)
                if ";" in line:
                    tree = USE.sub("", statement[1].strip(), count=1).split(";")[0]
                    for target in use_paths(tree):
                        if target.split("::")[0] in ("crate", "self", "super"):
                            name(target, statement[0])
                    statement = None
                continue
            for m in RELATIVE.finditer(line):
                name(m.group(1), number)
    return imports


def file_cycles(crate_src):
    """One problem line for each group of files that import each other, with one shortest cycle through it."""
    src = REPO / crate_src
    modules = crate_modules(src)
    imports = file_imports(modules)
    graph = defaultdict(set)
    for a, b in imports:
        graph[a].add(b)
    files = sorted(f for fs in modules.values() for f in fs)

    # Tarjan's strongly connected components.
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for f in files:
        if f not in index:
            strong(f)

    problems = []
    for group in groups:
        start, members = group[0], set(group)
        came_from, queue, cycle = {start: None}, [start], None
        while queue and cycle is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    cycle = [v]
                    while came_from[cycle[-1]] is not None:
                        cycle.append(came_from[cycle[-1]])
                    cycle = cycle[::-1] + [start]
                    break
                if w in members and w not in came_from:
                    came_from[w] = v
                    queue.append(w)
        rel = lambda f: str(f.relative_to(src))
        steps = " -> ".join(f"{rel(a)}:{imports[(a, b)][0]}" for a, b in zip(cycle, cycle[1:]))
        problems.append(
            f"{crate_src}: file cycle among {', '.join(map(rel, group))}: {steps} -> {rel(start)} (move the shared "
            f"item to the file it belongs in)"
        )
    return problems, len(files), len(imports)


def main():
    folders = sorted(p.name for p in SRC.iterdir() if p.is_dir())
    # A file at the crate root is a node of its own (`error.rs`, `stop.rs`); lib.rs re-exports and is no node.
    nodes = set(folders) | {p.stem for p in SRC.glob("*.rs") if p.stem != "lib"}
    problems = []
    edges = defaultdict(int)
    for path in sorted(SRC.rglob("*.rs")):
        source = node_of(path)
        if source == "lib":
            continue
        for number, line in code_lines(path):
            if "crate::{" in line:
                problems.append(f"{path.relative_to(SRC)}:{number}: one path per `use`: {line.strip()}")
            for m in PATH.finditer(line):
                segments = m.group(1).split("::")
                first = segments[0]
                if first not in nodes:
                    problems.append(
                        f"{path.relative_to(SRC)}:{number}: `crate::{m.group(1)}` goes through a re-export of "
                        f"lib.rs; name it by its folder"
                    )
                    continue
                if source == "error" and first not in ("sys", "error"):
                    group = re.match(r"::\{([^}]*)\}", line[m.end():])
                    names = [n.strip() for n in group.group(1).split(",")] if group else [segments[-1]]
                    for name in filter(None, names):
                        leaf = defining_file(name)
                        if leaf is None or crate_nodes(leaf) - {"sys"}:
                            problems.append(
                                f"error.rs:{number}: `{name}` (`crate::{m.group(1)}`) is above error.rs: not a "
                                f"type in a file that names nothing of the crate but sys"
                            )
                    continue  # a leaf is below error.rs, wherever its file is
                if first != source:
                    edges[(source, first)] += 1

    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    # Depth-first search for a cycle, reporting the first one found.
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                problems.append("cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(nodes):
        if n not in state:
            visit(n)

    if "--dot" in sys.argv[1:]:
        print("digraph turbotun {")
        for (a, b), count in sorted(edges.items()):
            print(f'  "{a}" -> "{b}" [label={count}];')
        print("}")
    else:
        print("folder imports (paths named in code):")
        drawn = []
        for a in sorted(nodes):
            targets = ", ".join(f"{b} ({edges[(a, b)]})" for b in sorted(graph[a]))
            drawn.append(f"{a:14} -> {targets or '-'}")
            print(f"  {drawn[-1]}")
        # docs/ARCHITECTURE.md shows this graph; it is generated here, so the copy there must be this one.
        architecture = ARCHITECTURE.read_text()
        if "\n".join(drawn) not in architecture:
            problems.append(
                f"{ARCHITECTURE.relative_to(ROOT)}: its folder graph is not the code's: paste the lines above "
                "(without their indent) in place of the block that begins `applications   ->`"
            )
    for crate_src in CRATES:
        cycles, files, count = file_cycles(crate_src)
        problems += cycles
        if "--dot" not in sys.argv[1:]:
            print(f"file imports: {crate_src}: {files} files, {count} imports, {len(cycles)} cycles")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
