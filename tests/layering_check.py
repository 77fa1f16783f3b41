#!/usr/bin/env python3
"""docs/DESIGN.md's folder table held against the code, both ways: every
#include "x/..." of product code (tests, fuzz targets and test fakes
excepted) names a header of its own folder or of a folder in its row's "may
use" column, and every folder in that column is included there at least once.
Usage: layering_check.py REPO_ROOT  -> exit 0, or 1 with one line per breach."""
import os
import re
import sys

root = sys.argv[1]
design = open(os.path.join(root, "docs", "DESIGN.md"), encoding="utf-8").read()
section = design.split("## Folders and what each may use", 1)[1].split("\n## ", 1)[0]
allowed = {}
for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 3 or not cells[0].startswith("`"):
        continue
    folder = cells[0].strip("`").rstrip("/")
    uses = cells[2]
    allowed[folder] = None if uses.startswith("everything") and "but" not in uses else {
        u.rstrip("/") for u in re.findall(r"`([a-z_/]+/)`", uses)}
if not allowed:
    sys.exit("layering_check: no folder table found in docs/DESIGN.md")

folders = sorted(allowed, key=len, reverse=True)  # the longest prefix owns a file
test_file = re.compile(r"(_test\.(cc|h|c)$|_test_producer\.|/fake_|^tests/|/tests/|/fuzz/)")


def owner(path):
    # What users compile against is included as "numa_loader/...".
    if path.startswith("numa_loader/"):
        path = "include/" + path
    return next((f for f in folders if path.startswith(f + "/")), None)


breaches, checked = [], 0
used = {f: set() for f in allowed}  # folder -> the folders its includes reach
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
    for f in files:
        if not f.endswith((".cc", ".h", ".c", ".cu")):
            continue
        rel = os.path.relpath(os.path.join(d, f), root)
        src = owner(rel)
        if src is None or test_file.search(rel):
            continue
        checked += 1
        ok_set = allowed[src]
        text = open(os.path.join(d, f), encoding="utf-8", errors="replace").read()
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            dst = owner(m.group(1))
            if dst is not None and dst != src:
                used[src].add(dst)
            if dst is None or dst == src or ok_set is None or dst in ok_set:
                continue
            breaches.append(f"{rel}:{n}: includes {m.group(1)}, but {src}/ may use "
                            + (("only " + ", ".join(sorted(x + "/" for x in ok_set))) if ok_set else "nothing of the project"))
# The other direction: a row allows no use the code does not make.
for folder, ok_set in sorted(allowed.items()):
    for unused in sorted((ok_set or set()) - used[folder]):
        breaches.append(f"docs/DESIGN.md: {folder}/ may use {unused}/, but none of its includes does "
                        "(take it out of the row, or the table says what is not so)")
for b in breaches:
    print(b)
print(f"layering: {checked} files checked, {len(breaches)} disagreement(s) with docs/DESIGN.md's table")
sys.exit(1 if breaches else 0)
