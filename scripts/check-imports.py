#!/usr/bin/env python3
"""The turbotun crate's imports, checked: one path per module, and no cycle between its folders.

Inside `crates/turbotun/src`, code names a module by its folder (`crate::dataplane::batch`), never by the flat
re-exports that `lib.rs` keeps for users (`crate::batch`) nor by a root re-export of an item (`crate::Queue`).
From those paths this draws the graph of the folders (`sys`, `devices`, ...; `error.rs` as one more node) and
fails on a cycle. `error.rs` sits below every folder but `sys`: any other module it names must be a leaf, a file
that itself names nothing of the crate but `sys` (the error types that `Error` wraps).

Only code counts: comment lines (doc links among them) are skipped, since docs link the public, flat paths.

    scripts/check-imports.py           check; print the folder graph
    scripts/check-imports.py --dot     the folder graph in Graphviz's dot language
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "crates" / "turbotun" / "src"
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


def main():
    folders = sorted(p.name for p in SRC.iterdir() if p.is_dir())
    nodes = set(folders) | {"error"}
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
        for a in sorted(nodes):
            targets = ", ".join(f"{b} ({edges[(a, b)]})" for b in sorted(graph[a]))
            print(f"  {a:14} -> {targets or '-'}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
