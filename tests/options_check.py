#!/usr/bin/env python3
"""Each command-line option is defined once (ctest `options_defined_once`).

1. Every long option of the loader's command lines (`loader`, `loader_bench`,
   the trainer, the benches) is defined by exactly one definition in the tree:
   an entry of loader/cli/option_table.h, or one add_option / add_flag call
   with the flag's text. A flag that several command lines take is added
   from the table (`Add(app, opt::kBatchSize, ...)`), never spelled again.
2. The libraries below the command lines (loader/plan, loader/pipeline,
   formats) hold no flag text outside comments: their messages name the
   field (`batch_size`), and the command lines map it to the flag.

pack_tool is outside check 1: its options are the packer's own (by the
layering it cannot use loader/cli), and its --split, --seed, --threads,
--out and --json are the packer's.

Usage: options_check.py SOURCE_ROOT
"""
import os
import re
import sys

# Names that mean different things in different command lines, each with why.
DIFFERENT_MEANINGS = {
    "--threads": "loader serve: loader threads; trainer: LibTorch threads (its loader threads "
                 "are --loader-threads)",
}

PRODUCT_DIRS = ("base", "formats", "loader", "trainer", "bench")
LIBRARY_DIRS = ("loader/plan", "loader/pipeline", "formats")


def sources(root, dirs):
    for d in dirs:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if not f.endswith((".cc", ".h")):
                    continue
                if f.endswith(("_test.cc", "_test.h")) or "fuzz" in f or "/testing" in dirpath:
                    continue
                yield os.path.join(dirpath, f)


def strip_comments(text):
    """The text with // and /* */ comments blanked (string literals kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif c == "'" and i + 2 < n:
            j = text.index("'", i + 1 + (text[i + 1] == "\\"))
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


CALL = re.compile(r'\b(add_option|add_flag|add_flag_function|add_flag_callback)\(\s*"([^"]*)"')
TABLE_ENTRY = re.compile(r'\.flag\s*=\s*"(--[a-z0-9-]+)"')
NEGATION = re.compile(r'"\s*,!(--[a-z0-9-]+)"')
FLAG_TEXT = re.compile(r'"[^"\n]*?(?<![A-Za-z0-9-])(--[a-z][a-z0-9-]+)[^"\n]*"')


def definitions(root):
    defs = {}
    for path in sources(root, PRODUCT_DIRS):
        rel = os.path.relpath(path, root)
        text = strip_comments(open(path, encoding="utf-8").read())
        for m in CALL.finditer(text):
            for name in m.group(2).split(","):
                name = name.strip().lstrip("!")
                if name.startswith("--"):
                    defs.setdefault(name, []).append(rel)
        for m in TABLE_ENTRY.finditer(text):
            defs.setdefault(m.group(1), []).append(rel + " (table)")
        for m in NEGATION.finditer(text):
            defs.setdefault(m.group(1), []).append(rel)
    return defs


def flag_texts(root):
    found = []
    for path in sources(root, LIBRARY_DIRS):
        rel = os.path.relpath(path, root)
        text = strip_comments(open(path, encoding="utf-8").read())
        for m in FLAG_TEXT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append("%s:%d: %s" % (rel, line, m.group(1)))
    return found


def main():
    root = sys.argv[1]
    problems = []
    defs = definitions(root)
    if len(defs) < 40 or "--batch-size" not in defs:
        problems.append("found only %d option names: the scan is broken" % len(defs))
    for name, where in sorted(defs.items()):
        if len(where) > 1 and name not in DIFFERENT_MEANINGS:
            problems.append("%s is defined %d times: %s (add it from loader/cli/option_table.h "
                            "everywhere)" % (name, len(where), ", ".join(where)))
    for name in DIFFERENT_MEANINGS:
        if len(defs.get(name, [])) < 2:
            problems.append("%s is listed as meaning different things but is defined %d times: "
                            "drop it from DIFFERENT_MEANINGS" % (name, len(defs.get(name, []))))
    for hit in flag_texts(root):
        problems.append("flag text in a library (name the field in backquotes, `field`, "
                        "and let the command line map it): " + hit)
    for p in problems:
        print("options_check: " + p)
    shared = sorted(n for n, w in defs.items() if any("(table)" in x for x in w))
    print("options_check: %d option names, %d from the shared table; %s" %
          (len(defs), len(shared), "FAILED" if problems else "each defined once"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
