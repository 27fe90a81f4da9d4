#!/usr/bin/env python3
"""Checks the dependency rule between the folders of src/titan (CONTRIBUTING.md, "Layering").

Every `#include "titan/<folder>/..."` in src/titan/<layer>/... must name a folder that <layer> may
use. Prints each violating include as file:line and exits 1 when there is one.
Usage: scripts/check_layering.py [repo root]
"""
import pathlib
import re
import sys

# Which folders each folder of src/titan may include (itself always). Lower layers never include
# higher ones, so a device backend or a new op can be added without touching what lies below.
ALLOWED = {
    "core": set(),
    "autograd": {"core"},
    "kernels": {"core", "autograd"},
    "backend": {"core", "io"},
    "ops": {"core", "autograd", "kernels", "backend"},
    "nn": {"core", "autograd", "kernels", "ops"},
    "io": {"core"},
    "data": {"core", "io"},
    "dist": {"core", "autograd", "kernels", "ops", "nn"},
    "models": {"core", "autograd", "kernels", "ops", "nn", "io"},
    "train": {"core", "autograd", "kernels", "backend", "ops", "nn", "io", "data", "dist", "models"},
    "cli": {"core", "autograd", "kernels", "backend", "ops", "nn", "io", "data", "dist", "models", "train"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"titan/([^/"]+)/')


def violations(root):
    src = root / "src" / "titan"
    found = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in {".h", ".cpp", ".cu", ".cuh"} or not path.is_file():
            continue
        layer = path.relative_to(src).parts[0]
        if layer not in ALLOWED:
            found.append(f"{path.relative_to(root)}: folder src/titan/{layer} has no entry in the layering rule")
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) != layer and m.group(1) not in ALLOWED[layer]:
                found.append(f"{path.relative_to(root)}:{n}: {layer} may not include titan/{m.group(1)}/ "
                             f"({line.strip()}); {layer} may include: "
                             f"{', '.join(sorted(ALLOWED[layer] | {layer}))}")
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) break the layering rule (CONTRIBUTING.md, Layering)")
        return 1
    print("layering: every #include \"titan/...\" follows the rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
