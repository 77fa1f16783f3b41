"""The Python binding's own logic, against a stand-in client library
(fake_nl_client.c) whose behaviour each job id picks.

Usage: binding_test.py FAKE_LIB PYTHON_DIR
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

fake_lib, pydir = sys.argv[1], sys.argv[2]
os.environ["NUMA_LOADER_LIB"] = fake_lib
sys.path.insert(0, pydir)
import numpy as np  # noqa: E402

import numa_loader  # noqa: E402
from numa_loader import Client, LoaderError, LoaderTimeout  # noqa: E402

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


def raises(exc, fn):
    """The exception fn() raises if it is an `exc`, else None."""
    try:
        fn()
    except exc as e:
        return e
    except Exception as e:  # noqa: BLE001
        print("    raised %s: %s" % (type(e).__name__, e))
        return None
    return None


def want_pixels(seq, size, sample_bytes=12):
    return (np.arange(size * sample_bytes) + seq * 7).astype(np.uint8)


# --- iteration, shapes, values, read-only views ---------------------------
with Client("plain", 3) as c:
    info = c.info
    expect((info.batch_size, info.channels, info.height, info.width, info.layout, info.dtype.name,
            info.rank, info.producer_pid, info.batches_per_epoch, info.epochs)
           == (4, 3, 2, 2, "NCHW", "uint8", 3, 4242, 3, 2), "info: %r" % info)
    seen = []
    prev = None
    for b in c:
        if prev is not None:
            expect(prev.released, "batch %d is released when the next is asked for" % prev.sequence)
            e = raises(LoaderError, lambda: prev.pixels)
            expect(e is not None and "was released" in str(e), "pixels of a released batch raise")
            expect(raises(LoaderError, lambda: prev.labels) is not None, "labels too")
        seen.append((b.epoch, b.batch, b.sequence, b.size))
        px = b.pixels
        expect(px.shape == (b.size, 3, 2, 2) and px.dtype == np.uint8, "NCHW shape %s" % (px.shape,))
        expect(np.array_equal(px.reshape(-1), want_pixels(b.sequence, b.size)),
               "pixels of batch %d" % b.sequence)
        expect(b.labels.dtype == np.int64 and b.labels.shape == (b.size,) and
               list(b.labels) == [b.epoch * 10 + b.batch * 2 + i for i in range(b.size)],
               "labels of batch %d" % b.sequence)
        expect(list(b.indices) == [b.sequence * 100 + i for i in range(b.size)],
               "indices of batch %d" % b.sequence)
        expect(not px.flags.writeable and not b.labels.flags.writeable, "views are read-only")
        expect(b.pixels is px, "the same view on each access")
        prev = b
    expect(seen == [(0, 0, 0, 4), (0, 1, 1, 4), (0, 2, 2, 2), (1, 0, 3, 4), (1, 1, 4, 4),
                    (1, 2, 5, 2)], "two epochs in order, ending at NL_END: %s" % seen)
    expect(prev.released, "NL_END came after the last batch was released")
expect(c.closed, "the with block closes the client")
expect(isinstance(raises(LoaderError, lambda: next(c)), LoaderError), "next() on a closed client raises")
c.close()  # twice: a no-op

with Client("nhwc-float", 0) as c:
    b = next(c)
    expect(b.pixels.shape == (4, 2, 2, 3) and b.pixels.dtype == np.float32, "NHWC float32 shape")
    expect(np.array_equal(b.pixels.reshape(-1), np.arange(48, dtype=np.float32)), "float32 values")

# --- release_after: synchronize before the slot goes back ------------------
class Event:
    def __init__(self, batch, log):
        self.batch, self.log = batch, log
        self.pixels = batch.pixels.copy()

    def synchronize(self):
        b = self.batch
        self.log.append(b.sequence)
        ok = not b.released and np.array_equal(b.pixels, self.pixels)
        expect(ok, "batch %d: synchronize() runs while the slot still holds its pixels" % b.sequence)


log = []
with Client("plain", 0) as c:
    for b in c:
        b.release_after(Event(b, log))
        expect(log == list(range(b.sequence)), "before batch %d: events of 0..%d synchronized"
               % (b.sequence, b.sequence - 1))
expect(log == list(range(6)), "every event synchronized once, the last at NL_END: %s" % log)

log = []
c = Client("plain", 0)
b = next(c)
b.release_after(Event(b, log))
c.close()
expect(log == [0] and b.released, "close() synchronizes the held batch's event first")

log = []
with Client("plain", 0) as c:
    b = next(c)
    b.release_after(Event(b, log))
    b.release()
    expect(log == [0] and b.released, "release() synchronizes first")
    b.release()  # twice: a no-op
    expect(next(c).sequence == 1, "the iterator goes on after an explicit release")


class Failing:
    def synchronize(self):
        raise RuntimeError("CUDA error: an illegal memory access")


with Client("plain", 0) as c:
    b = next(c)
    b.release_after(Failing())
    e = raises(RuntimeError, lambda: next(c))
    expect(e is not None and "illegal memory" in str(e), "an event's error reaches the caller")
    expect(not b.released and b.pixels is not None, "and the slot stays held")
    b.release_after(Event(b, []))
    expect(next(c).sequence == 1, "with a working event, the loop goes on")
expect(raises(TypeError, lambda: Client("plain", 0).__next__().release_after(42)) is not None,
       "release_after(42) is a TypeError")

# --- seek and set_epoch ---------------------------------------------------
with Client("plain", 0) as c:
    b = next(c)
    c.set_epoch(1)  # releases b first (the fake refuses a seek with a slot held)
    expect(b.released, "set_epoch releases the held batch")
    b2 = next(c)
    expect((b2.epoch, b2.batch) == (1, 0), "set_epoch(1): next is (1, 0), got (%d, %d)" % (b2.epoch, b2.batch))
    c.seek(0, 2)
    b3 = next(c)
    expect((b3.epoch, b3.batch, b3.size) == (0, 2, 2), "seek(0, 2)")
    expect(raises(ValueError, lambda: c.seek(-1, 0)) is not None, "seek(-1, 0) is a ValueError")
    e = raises(ValueError, lambda: c.seek(2**64, 0))
    expect(e is not None and "outside 0 .. 18446744073709551615" in str(e),
           "seek(2**64, 0) is a ValueError, not epoch 0: %s" % e)
    for bad in ((1.5, 2), (0, 2.0), ("1", 0), (True, 0)):
        e = raises(TypeError, lambda: c.seek(*bad))
        expect(e is not None and "must be a whole number" in str(e), "seek%r is a TypeError: %s" % (bad, e))
    c.seek(np.int64(1), np.uint8(1))
    expect((lambda b: (b.epoch, b.batch))(next(c)) == (1, 1), "numpy integers are whole numbers")

# --- arrays outlive their client: the mapping goes with the last view ---------
import ctypes  # noqa: E402
import gc  # noqa: E402

_fake = ctypes.CDLL(fake_lib)


def counts():
    g, d = ctypes.c_int(), ctypes.c_int()
    _fake.fake_counts(ctypes.byref(g), ctypes.byref(d))
    return g.value, d.value


g0, d0 = counts()
c = Client("plain", 0)
c.close()
expect(counts() == (g0 + 1, d0 + 1), "close() with no array: goodbye, and the ring unmapped at once")
for order in ("client first", "batch first"):
    c = Client("plain", 0)
    b = next(c)  # (rebinding b and c lets earlier tests' clients and batches go)
    px, labels = b.pixels, b.labels
    want_px, want_labels = px.copy(), labels.copy()
    gc.collect()
    g0, d0 = counts()
    c.close()
    expect(counts() == (g0 + 1, d0), "%s: close() says goodbye; the ring stays while arrays view it" % order)
    if order == "client first":
        del c
        gc.collect()
        del b
    else:
        del b
        gc.collect()
        del c
    gc.collect()
    expect(counts()[1] == d0 and (px == want_px).all() and (labels == want_labels).all(),
           "%s: the arrays still read their batch with the client and batch gone" % order)
    del px
    gc.collect()
    expect(counts()[1] == d0, "%s: one array left keeps the ring" % order)
    del labels
    gc.collect()
    expect(counts()[1] == d0 + 1, "%s: the last array gone, the ring is unmapped" % order)

# --- what ctypes would cut without a word ----------------------------------
for job, rank, exc, text in (("plain", 2**32, ValueError, "rank 4294967296 is outside 0 .. 2147483647"),
                             ("plain", -1, ValueError, "rank -1 is outside"),
                             ("plain", 1.7, TypeError, "rank must be a whole number, not 1.7"),
                             ("plain", "1", TypeError, "rank must be a whole number"),
                             ("pl\0ain", 0, ValueError, "holds a NUL character")):
    e = raises(exc, lambda: Client(job, rank))
    expect(e is not None and text in str(e), "Client(%r, %r) is a %s: %s" % (job, rank, exc.__name__, e))

# --- a forked child: the parent's client is not its own ---------------------
with Client("plain", 0) as c:
    first = next(c)
    pid = os.fork()
    if pid == 0:  # the child: every use refused, closing leaves the parent's connection alone
        code = 0
        e = raises(LoaderError, lambda: next(c))
        if e is None or "(a fork): attach a Client of its own here" not in str(e):
            code = 1
        if raises(LoaderError, lambda: c.seek(0, 0)) is None:
            code |= 2
        c.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    expect(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
           "in a forked child next() and seek() raise LoaderError naming the fork (child status %d)" % status)
    expect(not c.closed and next(c).sequence == first.sequence + 1, "the parent's client goes on after the fork")

# --- errors ---------------------------------------------------------------
e = raises(LoaderError, lambda: Client("missing", 1))
expect(e is not None and not isinstance(e, LoaderTimeout) and "no producer for job 'missing' rank 1" in str(e),
       "a failed attach raises LoaderError with nl_attach_error's text")
e = raises(LoaderTimeout, lambda: Client("slow", 0, timeout_s=0.5))
expect(e is not None and "no producer within" in str(e), "an attach timeout raises LoaderTimeout")
with Client("error", 0) as c:
    got = []
    e = raises(LoaderError, lambda: [got.append(b.sequence) for b in c])
    expect(got == [0, 1], "batches before the error are delivered")
    expect(e is not None and not isinstance(e, LoaderTimeout) and "payload CRC32C mismatch" in str(e)
           and isinstance(e, RuntimeError), "the producer's error text arrives in a LoaderError: %s" % e)
with Client("stuck", 0, timeout_s=2) as c:
    next(c)
    e = raises(LoaderTimeout, lambda: next(c))
    expect(e is not None and "alive but has sent nothing for" in str(e), "NL_TIMEOUT raises LoaderTimeout")

# Ctrl-C while waiting without a timeout: the wait is made of short C calls,
# so Python's handler runs (a single blocking call would sleep for an hour).
script = ("import numa_loader, sys\n"
          "c = numa_loader.Client('stuck', 0, timeout_s=None)\n"
          "next(c)\n"
          "try:\n"
          "    print('waiting', flush=True)\n"
          "    next(c)\n"
          "except KeyboardInterrupt:\n"
          "    c.close()\n"
          "    print('interrupted', flush=True)\n")
p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                     env=dict(os.environ, PYTHONPATH=pydir))
first = p.stdout.readline()
p.send_signal(signal.SIGINT)
try:
    rest, _ = p.communicate(timeout=60)  # a hang guard, not a timing check
except subprocess.TimeoutExpired:
    p.kill()
    rest, _ = p.communicate()
expect(first == "waiting\n" and rest == "interrupted\n" and p.returncode == 0,
       "SIGINT during an unbounded wait raises KeyboardInterrupt (%r %r, exit %s)" % (first, rest, p.returncode))

# ... and while waiting for a producer to appear (nl_attach runs in a helper thread).
script = ("import numa_loader, sys\n"
          "try:\n"
          "    print('attaching', flush=True)\n"
          "    numa_loader.Client('slow', 0, timeout_s=None)\n"
          "except KeyboardInterrupt:\n"
          "    print('interrupted', flush=True)\n")
p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                     env=dict(os.environ, PYTHONPATH=pydir))
first = p.stdout.readline()
time.sleep(0.5)  # (only so that the signal tends to land inside the wait; either way it must work)
p.send_signal(signal.SIGINT)
try:
    rest, _ = p.communicate(timeout=60)  # a hang guard, not a timing check
except subprocess.TimeoutExpired:
    p.kill()
    rest, _ = p.communicate()
expect(first == "attaching\n" and rest == "interrupted\n" and p.returncode == 0,
       "SIGINT while attaching raises KeyboardInterrupt (%r %r, exit %s)" % (first, rest, p.returncode))

# --- torch ---------------------------------------------------------------
try:
    import torch
    import warnings
    with Client("plain", 0) as c, warnings.catch_warnings(record=True):
        b = next(c)
        t = torch.from_numpy(b.pixels)
        expect(t.data_ptr() == b.pixels.ctypes.data and t.shape == (4, 3, 2, 2),
               "torch.from_numpy views the slot (same address)")
        expect(torch.equal(t.reshape(-1), torch.from_numpy(want_pixels(0, 4))), "and equals")
except ImportError:
    print("skip - torch is not installed")

# --- the library is found, or a clear error --------------------------------
r = subprocess.run([sys.executable, "-c", "import numa_loader; numa_loader.Client('x', 0)"],
                   env=dict(os.environ, NUMA_LOADER_LIB="/nonexistent/libnl_client.so",
                            PYTHONPATH=pydir), capture_output=True, text=True)
expect(r.returncode == 1 and "LoaderError: cannot find libnl_client.so at /nonexistent/libnl_client.so "
       "(from NUMA_LOADER_LIB)" in r.stderr, "a missing library is named: %s" % r.stderr.strip()[-200:])
expect(numa_loader.library_path() == fake_lib, "NUMA_LOADER_LIB overrides _build.py")
src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")  # the source tree: no _build.py
env = dict(os.environ, PYTHONPATH=src)
env.pop("NUMA_LOADER_LIB")
r = subprocess.run([sys.executable, "-c", "import numa_loader; numa_loader.Client('x', 0)"], env=env,
                   capture_output=True, text=True)
expect(r.returncode == 1 and "cannot find libnl_client.so: NUMA_LOADER_LIB is not set and " in r.stderr
       and "_build.py is missing (use the package the build lays out, PYTHONPATH=<build>/python"
       in r.stderr, "the package from the source tree says where to look: %s" % r.stderr.strip()[-160:])

# --- python3 -m numa_loader.consume ----------------------------------------
def consume(*args):
    return subprocess.run([sys.executable, "-m", "numa_loader.consume"] + list(args),
                          env=dict(os.environ, PYTHONPATH=pydir), capture_output=True, text=True)


with tempfile.TemporaryDirectory() as d:
    r = consume("--job-id", "plain", "--rank", "0", "--json", "--dump", d + "/dump")
    expect(r.returncode == 0, "consume --json: exit 0 (%s)" % r.stderr.strip())
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    expect(r.stdout.count("\n") == 1, "one line of JSON")
    expect({k: j.get(k) for k in ("job_id", "rank", "batches", "images", "first_epoch", "first_batch",
                                  "last_epoch", "last_batch", "epochs")}
           == {"job_id": "plain", "rank": 0, "batches": 6, "images": 20, "first_epoch": 0,
               "first_batch": 0, "last_epoch": 1, "last_batch": 2, "epochs": [0, 1]}, "the JSON: %s" % j)
    expect(all(isinstance(j.get(k), float) and j[k] >= 0 for k in
               ("seconds", "images_per_s", "batches_per_s", "per_batch_us")), "rates are numbers")
    want = b""
    for seq, size in enumerate([4, 4, 2, 4, 4, 2]):
        e, bb = divmod(seq, 3)
        want += want_pixels(seq, size).tobytes()
        want += np.array([e * 10 + bb * 2 + i for i in range(size)], "<i8").tobytes()
        want += np.array([seq * 100 + i for i in range(size)], "<i8").tobytes()
    expect(open(d + "/dump", "rb").read() == want, "--dump: pixels, labels, indices per batch")

    r = consume("--job-id", "plain", "--rank", "0", "--batches", "4")
    expect(r.returncode == 0 and re.fullmatch(
        r"consumed 4 batches \(14 images\) of job plain, rank 0 in [0-9.]+ s: [0-9]+ images/s, "
        r"[0-9.]+ batches/s; next\+release cost [0-9.]+ us per batch\n", r.stdout),
        "human line: %s" % r.stdout.strip())
    r = consume("--job-id", "plain", "--batches", "7", "--json")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    expect(j.get("batches") == 6 and j.get("end") == "the producer's last epoch is out" and
           j.get("producer_pid") == 4242, "--batches past the end: exit 0, 6 batches and why")
    r = consume("--job-id", "plain", "--start-epoch", "1", "--start-batch", "1", "--json")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    expect((j.get("batches"), j.get("first_epoch"), j.get("first_batch")) == (2, 1, 1),
           "--start-epoch 1 --start-batch 1: 2 batches from (1, 1): %s" % r.stdout.strip())
    r = consume("--job-id", "error", "--rank", "0")
    expect(r.returncode == 1 and "payload CRC32C mismatch" in r.stderr and
           r.stdout.startswith("consumed 2 batches (8 images) of job error"),
           "producer error: exit 1, the reason on stderr, the report on stdout")
    r = consume("--job-id", "stuck", "--rank", "0", "--timeout", "1")
    expect(r.returncode == 2 and "alive but" in r.stderr, "timeout: exit 2")
    r = consume("--job-id", "missing", "--rank", "1")
    expect(r.returncode == 1 and "no producer for job 'missing' rank 1" in r.stderr, "no producer: exit 1")
    r = consume("--job-id", "plain", "--rank", "0", "--dump", d + "/no/such/dir/f")
    expect(r.returncode == 1 and "opening --dump" in r.stderr, "unwritable --dump: exit 1")
    r = consume("--job-id", "plain", "--rank", "0", "--batches", "-1")
    expect(r.returncode == 1 and "--batches must be 0 or more" in r.stderr, "--batches -1 is refused")
    r = subprocess.run([sys.executable, "-m", "numa_loader.consume", "--job-id", "plain", "--json"],
                       env=dict(os.environ, PYTHONPATH=pydir, RANK="3"), capture_output=True, text=True)
    expect(r.returncode == 0 and json.loads(r.stdout)["rank"] == 3, "the rank defaults to $RANK")

print("%d passed, %d failed" % (passes, failures))
sys.exit(1 if failures else 0)
