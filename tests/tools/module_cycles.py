#!/usr/bin/env python3
"""Fails when the modules of a static library call each other in a cycle (docs/core.md).

usage: module_cycles.py LIB.a [LIB.a ...]

Each object file is a module; module A depends on module B when A leaves undefined a
symbol that B defines (nm). Prints the dependency graph and every cycle (strongly
connected component of more than one module) and exits 1 if there is one."""

import collections
import os
import subprocess
import sys


def graph(archive):
    out = subprocess.run(["nm", "-A", archive], capture_output=True, text=True, check=True).stdout
    defs, uses = {}, collections.defaultdict(set)
    for line in out.splitlines():
        where, _, rest = line.rpartition(":")
        mod = os.path.basename(where).split(".c.o")[0]
        parts = rest.split()
        if len(parts) == 3 and parts[1] in "TDBRC":
            defs[parts[2]] = mod
        elif len(parts) == 2 and parts[0] == "U":
            uses[mod].add(parts[1])
    g = collections.defaultdict(set)
    for mod, syms in uses.items():
        for s in syms:
            if s in defs and defs[s] != mod:
                g[mod].add(defs[s])
    return g


def cycles(g):
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    bad = 0
    for lib in argv[1:]:
        g = graph(lib)
        found = cycles(g)
        print(f"{lib}: {len(g)} modules with dependencies")
        for m in sorted(g):
            print(f"  {m} -> {', '.join(sorted(g[m]))}")
        for c in found:
            print(f"CYCLE: {' <-> '.join(c)}")
            bad = 1
    print("no cycles" if not bad else "cycles found")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv))
