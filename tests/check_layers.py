#!/usr/bin/env python3
"""The layering rule of src/README.md, checked on the sources and the objects.

A file in src/<layer>/ may include and call only its own layer and the
layers below (base < os < segment < page < heap < api). Checked two ways:

- includes: every #include "..." of a src file names a header of its own
  layer or a lower one ("coralloc.h", the public header, is allowed);
- calls: from `nm` on the object files in BUILD_DIR, each undefined symbol of
  an object that another object defines is a call (or a data reference)
  from the first file to the second; the second must not be higher.

It also reports the largest set of files that reach each other through
calls (a strongly connected component of that graph), which must be at most
MAX_CYCLE files, all in one layer.

The call half must show that it saw the calls: it fails when nm lists no
defined symbol for an object, when it finds no file-to-file link at all, or
when a layer above base has no call into a lower one (see blind_spots).

Usage: check_layers.py SRC_DIR BUILD_DIR. Prints every offending pair and
exits 1 on any; exit 0 when the rule holds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

LAYERS = ["base", "os", "segment", "page", "heap", "api"]
MAX_CYCLE = 3
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def layer_of(path: Path, src: Path) -> str:
    return path.relative_to(src).parts[0]


def check_includes(src: Path) -> list[str]:
    errors = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".c", ".h", ".cc"):
            continue
        own = layer_of(path, src)
        if own not in LAYERS:
            errors.append(f"{path.relative_to(src)}: not in a layer folder ({', '.join(LAYERS)})")
            continue
        for name in INCLUDE.findall(path.read_text()):
            if name == "coralloc.h":
                continue
            target = name.split("/")[0]
            if target not in LAYERS:
                errors.append(f"{path.relative_to(src)} includes \"{name}\": not a layer header")
            elif LAYERS.index(target) > LAYERS.index(own):
                errors.append(
                    f"{path.relative_to(src)} ({own}) includes \"{name}\" ({target}): "
                    "a higher layer"
                )
    return errors


def nm_symbols(obj: Path) -> tuple[set[str], set[str]]:
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVW" and parts[1].isupper():
            defined.add(parts[2])
    return defined, undefined


def object_files(build: Path, src: Path) -> dict[str, Path]:
    """src-relative source name (e.g. heap/heap.c) -> its object file."""
    found: dict[str, Path] = {}
    for obj in build.rglob("*.o"):
        text = str(obj)
        if "/CMakeFiles/coralloc_core.dir/" not in text and "/CMakeFiles/coralloc.dir/" not in text:
            continue
        rel = text.split("/src/", 1)[-1][: -len(".o")]
        if rel.split("/")[0] in LAYERS:
            found[rel] = obj
    return found


Symbols = dict[str, tuple[set[str], set[str]]]


def call_graph(symbols: Symbols) -> dict[str, set[str]]:
    """symbols: per source name, what its object defines and leaves undefined."""
    defined_by = {sym: name for name, (defined, _) in symbols.items() for sym in defined}
    graph: dict[str, set[str]] = {name: set() for name in symbols}
    for name, (_, syms) in symbols.items():
        for sym in syms:
            target = defined_by.get(sym)
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def largest_cycle(graph: dict[str, set[str]]) -> list[str]:
    """The largest strongly connected component (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    best: list[str] = []
    counter = [0]

    def visit(v: str) -> None:
        nonlocal best
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > len(best):
                best = sorted(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return best


def blind_spots(objects: dict[str, Path], symbols: Symbols,
                graph: dict[str, set[str]]) -> list[str]:
    """What says the call half saw nothing: an object for which nm lists no
    defined symbol (nm failed or printed nothing), no file-to-file link at
    all, or a layer above base whose files call no lower layer (every layer
    builds on the one below, so each has such calls)."""
    errors = [f"nm lists no symbol defined in {name} ({obj})"
              for name, obj in sorted(objects.items()) if not symbols[name][0]]
    links = sum(len(t) for t in graph.values())
    if links == 0:
        errors.append(f"0 file-to-file links among {len(objects)} objects: the call check saw nothing")
    present = {name.split("/")[0] for name in objects}
    for layer in LAYERS[1:]:
        if layer not in present:
            continue
        down = [t for name, targets in graph.items() if name.split("/")[0] == layer
                for t in targets if LAYERS.index(t.split("/")[0]) < LAYERS.index(layer)]
        if not down:
            errors.append(f"no call from {layer} into a lower layer found: the call check is blind")
    return errors


def check_calls(src: Path, build: Path) -> list[str]:
    objects = object_files(build, src)
    if not objects:
        return [f"no object files of the library under {build}"]
    symbols = {name: nm_symbols(obj) for name, obj in objects.items()}
    graph = call_graph(symbols)
    errors = blind_spots(objects, symbols, graph)
    for name in sorted(graph):
        own = name.split("/")[0]
        for target in sorted(graph[name]):
            other = target.split("/")[0]
            if LAYERS.index(other) > LAYERS.index(own):
                errors.append(f"{name} ({own}) calls into {target} ({other}): a higher layer")
    cycle = largest_cycle(graph)
    layers = {name.split("/")[0] for name in cycle}
    print(f"largest set of files reaching each other by calls: {len(cycle)} {cycle}")
    if len(cycle) > MAX_CYCLE or len(layers) > 1:
        errors.append(f"files calling each other in a cycle: {cycle} (at most {MAX_CYCLE}, one layer)")
    print(f"{len(objects)} objects, {sum(len(t) for t in graph.values())} file-to-file links")
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    src, build = Path(argv[1]).resolve(), Path(argv[2]).resolve()
    errors = check_includes(src) + check_calls(src, build)
    for e in errors:
        print(f"layering: {e}")
    if not errors:
        print("layering: every include and call goes to the same layer or a lower one")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
