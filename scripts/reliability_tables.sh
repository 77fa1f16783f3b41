#!/usr/bin/env bash
# Regenerates the tables of docs/RELIABILITY.md from the scripts that measure
# them, so the document stays true:
#   - Pillow agreement: tests/badinput/pillow_agreement.py (needs build/, made
#     by scripts/test.sh);
#   - fuzzing: build-fuzz/fuzz-report.md, written by the last scripts/fuzz.sh run
#     (run `scripts/fuzz.sh 600` first for the 10-minute figures).
# Usage: scripts/reliability_tables.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/decode_probe ] || { echo "reliability_tables.sh: build/bin/decode_probe missing: run scripts/test.sh" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
/usr/bin/python3 tests/badinput/pillow_agreement.py build/bin/decode_probe "$scratch/c" --big \
  --report "$scratch/pillow.md" >/dev/null
tables=("pillow=$scratch/pillow.md")
[ -f build-fuzz/fuzz-report.md ] && tables+=("fuzz=build-fuzz/fuzz-report.md")
/usr/bin/python3 - docs/RELIABILITY.md "${tables[@]}" <<'PY'
import re, sys
doc = sys.argv[1]
text = open(doc).read()
for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    table = open(path).read().strip()
    pat = re.compile(r"(<!-- BEGIN %s -->\n).*?(\n<!-- END %s -->)" % (name, name), re.S)
    if not pat.search(text):
        sys.exit("no markers for %s in %s" % (name, doc))
    text = pat.sub(lambda m: m.group(1) + table + m.group(2), text)
open(doc, "w").write(text)
print("updated", doc)
PY
