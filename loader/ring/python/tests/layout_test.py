"""The ctypes mirrors of nl_info and nl_batch against the C compiler's layout.

Usage: layout_test.py PROBE PYTHON_DIR  (PROBE prints the layout as JSON)
"""
import ctypes
import json
import subprocess
import sys

probe, pydir = sys.argv[1], sys.argv[2]
sys.path.insert(0, pydir)
import numa_loader  # noqa: E402  (the library is loaded only by Client)

c = json.loads(subprocess.run([probe], check=True, capture_output=True, text=True).stdout)
failures = 0
passes = 0


def expect(cond, what):
    global failures, passes
    if cond:
        passes += 1
        print("ok   - " + what)
    else:
        failures += 1
        print("FAIL - " + what)


for name, py in (("nl_info", numa_loader._NlInfo), ("nl_batch", numa_loader._NlBatch)):
    want = c[name]
    expect(ctypes.sizeof(py) == want["size"],
           "sizeof(%s): ctypes %d, C %d" % (name, ctypes.sizeof(py), want["size"]))
    expect(ctypes.alignment(py) == want["align"],
           "alignment of %s: ctypes %d, C %d" % (name, ctypes.alignment(py), want["align"]))
    names = [f[0] for f in py._fields_]
    expect(names == list(want["fields"]), "%s: the same fields in the same order" % name)
    for f, (off, size) in want["fields"].items():
        d = getattr(py, f, None)
        got = (d.offset, d.size) if d is not None else None
        expect(got == (off, size), "%s.%s: ctypes (offset, size) %s, C %s" % (name, f, got, (off, size)))
for k, v in c["constants"].items():
    expect(getattr(numa_loader, k, None) == v, "%s = %d" % (k, v))

print("%d passed, %d failed" % (passes, failures))
sys.exit(1 if failures else 0)
