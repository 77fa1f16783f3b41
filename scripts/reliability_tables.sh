#!/usr/bin/env bash
# Regenerates the tables of docs/RELIABILITY.md from the scripts that measure
# them, so the document stays true:
#   - Pillow agreement: tests/badinput/pillow_agreement.py (needs build/, made
#     by scripts/test.sh);
#   - fuzzing: build-fuzz/fuzz-report.md, written by the last scripts/fuzz.sh run
#     (run `scripts/fuzz.sh 600` first for the 10-minute figures);
#   - the bad-input corpus: tests/badinput/corpus.py on build/bin (its
#     per-run table goes to docs/CORPUS.md);
#   - the soak: scripts/soak.py, 4 ranks x 5 epochs of a 50,000-image
#     CIFAR-100 at 224x224 through the service.
# Usage: scripts/reliability_tables.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/decode_probe ] || { echo "reliability_tables.sh: build/bin/decode_probe missing: run scripts/test.sh" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
chmod 755 "$scratch"  # the corpus runs one case as another user (nobody), who must reach it
/usr/bin/python3 tests/badinput/pillow_agreement.py build/bin/decode_probe "$scratch/c" --big \
  --report "$scratch/pillow.md" >/dev/null
/usr/bin/python3 tests/badinput/corpus.py build/bin "$scratch/corpus" --report "$scratch/corpus.md" \
  --detail "$scratch/corpus-detail.md" >/dev/null
{
  echo "# The bad-input corpus, run by run"
  echo
  echo "Written by \`scripts/reliability_tables.sh\` from \`tests/badinput/corpus.py\` (see"
  echo "docs/RELIABILITY.md). Each row: an input, a program that read it, its exit"
  echo "status and the first line of its message."
  echo
  cat "$scratch/corpus-detail.md"
} >docs/CORPUS.md
build/bin/pack_tool fake-cifar100 "$scratch/c100" --train 50000 --test 10 >/dev/null
build/bin/pack_tool cifar100 "$scratch/c100" "$scratch/soak" >/dev/null
/usr/bin/python3 scripts/soak.py build "$scratch/soak" --image-size 224 --batch-size 64 \
  --report "$scratch/soak.md" >/dev/null
tables=("pillow=$scratch/pillow.md" "corpus=$scratch/corpus.md" "soak=$scratch/soak.md")
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
