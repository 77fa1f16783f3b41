#!/usr/bin/env python3
"""The user documentation held against the tree and the binaries:
  - every relative link in README.md and docs/**/*.md names a file that
    exists, and a `#anchor` into a markdown file names one of its headings
    (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens,
    -1, -2, ... for repeats);
  - every long option (`--foo-bar`) that a command's --help prints appears
    in docs/guide/options.md. The commands are loader, pack_tool,
    loader_bench and trainer in BIN_DIR, each with the subcommands its own
    --help lists. A build without LibTorch has no trainer: it is skipped,
    and said so.
Usage: doc_links_check.py BIN_DIR [REPO_ROOT]  -> exit 0, or 1 with one line per problem."""
import functools
import os
import re
import subprocess
import sys

BINARIES = ("loader", "pack_tool", "loader_bench", "trainer")
OPTIONAL = ("trainer",)  # built only where LibTorch is found
OPTIONS_PAGE = os.path.join("docs", "guide", "options.md")

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) of the text outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def paragraphs(text):
    """(first line number, text) of each paragraph outside fenced code blocks,
    its code spans blanked: a link may wrap, and `[x](y)` in code is no link."""
    def blanked(lines):
        return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), "\n".join(lines))
    para, first, last = [], 0, 0
    for n, line in prose_lines(text):
        if para and (not line.strip() or n != last + 1):
            yield first, blanked(para)
            para = []
        if line.strip():
            first = first if para else n
            para.append(line)
            last = n
    if para:
        yield first, blanked(para)


def anchor(heading):
    """GitHub's anchor of a heading's text (before the -N of repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors_of(path):
    seen, found = {}, set()
    for _, line in prose_lines(open(path, encoding="utf-8").read()):
        m = HEADING.match(line)
        if m:
            a = anchor(m.group(2))
            found.add(a if a not in seen else "%s-%d" % (a, seen[a]))
            seen[a] = seen.get(a, 0) + 1
    return found


def doc_files(root):
    files = [os.path.join(root, "README.md")]
    for d, dirs, names in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        files += [os.path.join(d, f) for f in sorted(names) if f.endswith(".md")]
    return files


def link_problem(root, src, target):
    """"" when target (a link in file src) resolves, else what is wrong."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
        return ""
    path, _, frag = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(src), path)) if path else src
    if not os.path.exists(dest):
        return "names %s, which does not exist" % os.path.relpath(dest, root)
    if frag and dest.endswith(".md") and frag not in anchors_of(dest):
        return "names #%s, no heading of %s" % (frag, os.path.relpath(dest, root))
    return ""


def check_links(root):
    problems, count = [], 0
    for src in doc_files(root):
        for first, para in paragraphs(open(src, encoding="utf-8").read()):
            for m in LINK.finditer(para):
                count += 1
                why = link_problem(root, src, m.group(1))
                if why:
                    n = first + para.count("\n", 0, m.start())
                    problems.append("%s:%d: link %s %s" % (os.path.relpath(src, root), n, m.group(1), why))
    return problems, count


def run_help(argv):
    try:
        p = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "%s --help did not run: %s" % (" ".join(argv), e)
    if p.returncode != 0:
        return None, "%s --help exited %d: %s" % (" ".join(argv), p.returncode, p.stderr.strip()[:200])
    return p.stdout, ""


def section(help_text, title):
    """The lines of a CLI11 help section ("Options:", "Subcommands:")."""
    out, inside = [], False
    for line in help_text.split("\n"):
        if re.match(r"^\S.*:$", line):
            inside = line == title
        elif inside:
            out.append(line)
    return out


def long_options(help_text):
    """The long options an --help lists (from each option line's first field)."""
    names = set()
    for line in section(help_text, "Options:"):
        m = re.match(r"^\s{1,4}(-\S+)", line)  # an option line, not a description
        if m:
            names.update(re.findall(r"--[A-Za-z0-9][\w-]*", m.group(1)))
    names.discard("--help")
    return names


def commands(bin_dir):
    """[(argv, help text)] of every command and subcommand, and the problems."""
    found, problems = [], []
    for name in BINARIES:
        exe = os.path.join(bin_dir, name)
        if not os.access(exe, os.X_OK):
            if name in OPTIONAL:
                print("doc_links: skipped %s: not in %s (a build without LibTorch has none)" % (name, bin_dir))
            else:
                problems.append("%s: no such executable" % exe)
            continue
        text, why = run_help([exe])
        if text is None:
            problems.append(why)
            continue
        found.append(([name], text))
        for line in section(text, "Subcommands:"):
            sub = line.split()[0] if line.strip() else ""
            if not sub:
                continue
            sub_text, why = run_help([exe, sub])
            if sub_text is None:
                problems.append(why)
            else:
                found.append(([name, sub], sub_text))
    return found, problems


def check_options(root, bin_dir):
    page = open(os.path.join(root, OPTIONS_PAGE), encoding="utf-8").read()
    documented = set(re.findall(r"--[A-Za-z0-9][\w-]*", page))
    found, problems = commands(bin_dir)
    count = 0
    for argv, text in found:
        for opt in sorted(long_options(text)):
            count += 1
            if opt not in documented:
                problems.append("%s: `%s` prints %s, which is not on that page" % (
                    OPTIONS_PAGE, " ".join(argv + ["--help"]), opt))
    return problems, count, len(found)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.rsplit("Usage: ", 1)[1])
    bin_dir = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    link_problems, links = check_links(root)
    option_problems, options, cmds = check_options(root, bin_dir)
    for p in link_problems + option_problems:
        print(p)
    problems = len(link_problems) + len(option_problems)
    print("doc_links: %d links in %d files, %d options of %d commands; %d problem%s" % (
        links, len(doc_files(root)), options, cmds, problems, "" if problems == 1 else "s"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
