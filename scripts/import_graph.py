#!/usr/bin/env python
"""The import graph of `ngramspec/` (imports inside functions included): prints every
cycle between its modules and every import that breaks a layer rule, exit 1 if any.

    python scripts/import_graph.py

Rules (docs/architecture.md): nothing under ngramspec/batch/ or ngramspec/jobs/
imports ngramspec/server/; no module but an entry point (__main__) imports the command
line (ngramspec/cli/main.py).
A package's __init__ counts as its own module; importing `a.b` does not count as an
import of `a`.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ngramspec"
#: each layer's rank, lowest first: a folder under ngramspec/, a module at its top, or
#: "ngramspec" (the package's __init__, its library API)
RANK = {"errors": 0, "console": 0, "settings": 1, "llama": 2, "speculative": 3, "engine": 4,
        "jobs": 5, "adapter": 5, "doctor": 5, "ngramspec": 5, "server": 6, "batch": 6,
        "bench": 7, "cli": 8, "__main__": 9}


def layer(module: str) -> str:
    """The layer of a module: its folder under ngramspec/, else its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def allowed(src: str, dst: str) -> bool:
    """Whether module `src` may import module `dst` (the rules above)."""
    a, b = layer(src), layer(dst)
    if a == b or (src.endswith("__main__") and b == "cli"):
        return True
    return RANK[b] < RANK[a]


def modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(mods: dict[str, Path], name: str) -> set[str]:
    """The ngramspec modules `name` imports, anywhere in its file."""
    path = mods[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in mods}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            for a in node.names:
                target = f"{base}.{a.name}"
                found.add(target if target in mods else base)
    return {m for m in found if m in mods and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    mods = modules()
    graph = defaultdict(set, {m: imports(mods, m) for m in mods})
    unranked = sorted({layer(m) for m in mods} - set(RANK))
    bad = [f"{layer(m)} is not in RANK" for m in unranked] + \
        [f"{m} imports {d}" for m in sorted(graph) for d in sorted(graph[m]) if not allowed(m, d)]
    found = cycles(graph)
    for c in found:
        print("cycle:", " <-> ".join(c))
    for line in bad:
        print("layer:", line)
    print(f"{len(mods)} modules, {sum(len(v) for v in graph.values())} imports, "
          f"{len(found)} cycles, {len(bad)} layer violations")
    return 1 if found or bad else 0


if __name__ == "__main__":
    sys.exit(main())
