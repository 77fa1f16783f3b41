"""Soak the loader service: ranks x epochs through real `loader serve` processes
and their shared-memory rings, with consumers that pause at random.

Usage: scripts/soak.py BUILD_DIR DATA [--ranks 4] [--epochs 5] [--batch-size 32]
           [--image-size 64] [--threads 1] [--pause-max-ms 20] [--seed 1] [--json FILE]

Starts one `loader serve` per rank (world size --ranks, --drop-last, no
binding), consumes every rank's ring from a thread of this process with the
Python client (BUILD_DIR/python), pausing after a batch at random (one in
five batches up to --pause-max-ms, one in two hundred for a second: the
producer then holds every slot and waits). A sampler reads each serve's
resident memory (/proc/PID/status) four times a second. At the end it checks:

- every index of the split exactly once per epoch across the ranks;
- each serve's resident memory after the first epoch is flat: the largest
  sample of the last epoch is within 4 MiB + 2% of the largest of epoch 2
  (the first epoch warms allocators and the page cache, so it is reported,
  not compared);
- every serve exits 0, nothing of the job is left in /dev/shm or among the
  abstract sockets.

Prints a table (RSS per rank and epoch) and exits 0 when every check holds.
"""
import argparse, json, os, random, subprocess, sys, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("data")
ap.add_argument("--ranks", type=int, default=4)
ap.add_argument("--epochs", type=int, default=5)
ap.add_argument("--batch-size", type=int, default=32)
ap.add_argument("--image-size", type=int, default=64)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--pause-max-ms", type=float, default=20)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--json")
ap.add_argument("--report", help="also write the table (markdown) to this file")
a = ap.parse_args()

sys.path.insert(0, os.path.join(os.path.abspath(a.build), "python"))
import numa_loader  # noqa: E402

manifest = json.load(open(os.path.join(a.data, "manifest.json")))
num = manifest["splits"]["train"]["num_samples"]
kept = num - num % a.ranks  # --drop-last
job = "soak-%d" % os.getpid()
shm_before = set(os.listdir("/dev/shm"))
serves = []
for r in range(a.ranks):
    cmd = [os.path.join(a.build, "bin", "loader"), "serve", "--data", a.data, "--job-id", job,
           "--rank", str(r), "--world-size", str(a.ranks), "--local-rank", str(r),
           "--local-world-size", str(a.ranks), "--epochs", str(a.epochs), "--batch-size",
           str(a.batch_size), "--image-size", str(a.image_size), "--threads", str(a.threads),
           "--no-bind", "--drop-last", "--seed", str(a.seed), "--attach-timeout", "60"]
    serves.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

seen = [[[] for _ in range(a.epochs)] for _ in range(a.ranks)]
current = [0] * a.ranks  # the epoch each rank's consumer is in
errors = []
done = threading.Event()


def status_kib(pid, field):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


samples = [[[] for _ in range(a.epochs)] for _ in range(a.ranks)]  # RSS KiB per rank, epoch


def sampler():
    while not done.is_set():
        for r, p in enumerate(serves):
            kib = status_kib(p.pid, "VmRSS")
            if kib is not None:
                samples[r][min(current[r], a.epochs - 1)].append(kib)
        time.sleep(0.25)


def consume(r):
    rng = random.Random(a.seed * 1000 + r)
    try:
        client = numa_loader.Client(job, r, timeout_s=120, attach_timeout_s=60)
        try:
            for b in client:
                current[r] = b.epoch
                seen[r][b.epoch].extend(int(i) for i in b.indices)
                x = rng.random()
                if x < 0.005:
                    time.sleep(1.0)
                elif x < 0.2:
                    time.sleep(rng.uniform(0, a.pause_max_ms) / 1000)
        finally:
            client.close()
    except Exception as e:  # noqa: BLE001 (reported below)
        errors.append("rank %d: %s" % (r, e))


t0 = time.time()
threads = [threading.Thread(target=consume, args=(r,)) for r in range(a.ranks)]
samp = threading.Thread(target=sampler)
samp.start()
for t in threads:
    t.start()
for t in threads:
    t.join()
done.set()
samp.join()
codes = []
for r, p in enumerate(serves):
    try:
        codes.append(p.wait(timeout=30))
    except subprocess.TimeoutExpired:
        p.kill()
        codes.append(p.wait())
        errors.append("rank %d's serve did not exit after its stream" % r)
    err = p.stderr.read().decode(errors="replace").strip()
    if codes[-1] != 0:
        errors.append("rank %d's serve exited %d: %s" % (r, codes[-1], err[-400:]))
secs = time.time() - t0

# every index exactly once per epoch
for e in range(a.epochs):
    got = sorted(i for r in range(a.ranks) for i in seen[r][e])
    if got != list(range(kept)):
        dup = len(got) - len(set(got))
        errors.append("epoch %d: %d indices (%d distinct, %d repeated), wanted each of 0..%d once" %
                      (e, len(got), len(set(got)), dup, kept - 1))
# flat memory after the first epoch
rows = []
for r in range(a.ranks):
    peaks = [max(s) / 1024 if s else 0.0 for s in samples[r]]
    rows.append(peaks)
    if a.epochs >= 3 and samples[r][1] and samples[r][-1]:
        base, last = peaks[1], peaks[-1]
        if last > base * 1.02 + 4:
            errors.append("rank %d's serve grew from %.1f MiB (epoch 2) to %.1f MiB (epoch %d)" %
                          (r, base, last, a.epochs))
left = set(os.listdir("/dev/shm")) - shm_before
if left:
    errors.append("left in /dev/shm: %s" % sorted(left))
if any(("@numa_loader/" + job) in line for line in open("/proc/net/unix")):
    errors.append("a socket of the job is left")

table = ["| serve (peak RSS) | " + " | ".join("epoch %d" % (e + 1) for e in range(a.epochs)) + " |",
         "|---|" + "---:|" * a.epochs]
for r, peaks in enumerate(rows):
    table.append("| rank %d | " % r + " | ".join("%.1f MiB" % p for p in peaks) + " |")
head = ("%d ranks x %d epochs of %d images (%d kept), batch %d, %dx%d, %d loader thread(s) each, %.0f s; "
        "indices once per epoch: %s" % (a.ranks, a.epochs, num, kept, a.batch_size, a.image_size,
                                          a.image_size, a.threads, secs,
                                          "yes" if not any(e.startswith("epoch") for e in errors) else "NO"))
print("soak: " + head)
print("\n".join(table))
if a.report:
    open(a.report, "w").write(head + "\n\n" + "\n".join(table) + "\n")
if a.json:
    json.dump({"ranks": a.ranks, "epochs": a.epochs, "images": num, "kept": kept, "seconds": secs,
               "rss_mib_peak": rows, "errors": errors}, open(a.json, "w"), indent=1)
for e in errors:
    print("FAIL - " + e)
print("soak: %s" % ("every check held" if not errors else "%d problems" % len(errors)))
sys.exit(1 if errors else 0)
