"""The bad-input corpus, through every reader.

Writes malformed inputs of every kind a user's disk or a hostile user can
hold, and feeds each to every program that reads it:

- source inputs (image files, ImageFolder trees, CIFAR-100 directories and
  archives) to `pack_tool imagefolder` / `pack_tool cifar100`, strict and
  with --skip-bad;
- damaged shard sets (manifests, LMDB files, records with valid checksums
  that lie) to `pack_tool verify`, `loader preview`, `loader_bench` (the
  pipeline in the rank process) and `loader_bench --mode service` (a
  `loader serve` per rank and its shared-memory ring); records also with
  `--on-bad-record skip`.

Each case states its expected outcome: a clear error (exit 1) whose text
names the input and the reason, a skip with its reason, or a load (an image
Pillow loads must load). Every run must also end by itself within its time
limit, by exit (never a signal), with no sanitizer report, no uncaught
exception, no half-written output, no shared-memory segment left, and no
more memory than a small image needs (a bomb must be refused from its
header).

Usage: corpus.py BIN_DIR SCRATCH [--report FILE.md] [--detail FILE.md] [--only SUBSTRING] [--show]
  --report: the summary table (per input family); --detail: one row per run.
  BIN_DIR holds pack_tool, loader and loader_bench (an ASan build works).
  --show prints every run's output. Exit 0 when every check holds.
"""
import ctypes, io, json, os, re, shutil, stat, struct, subprocess, sys, tarfile, time, zlib

import lmdb
import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from nl_record import crc32c, record  # noqa: E402

BIN, SCRATCH = sys.argv[1], os.path.abspath(sys.argv[2])
REPORT = sys.argv[sys.argv.index("--report") + 1] if "--report" in sys.argv else None
DETAIL = sys.argv[sys.argv.index("--detail") + 1] if "--detail" in sys.argv else None
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
SHOW = "--show" in sys.argv
PT, LOADER, LB = (os.path.join(BIN, p) for p in ("pack_tool", "loader", "loader_bench"))
os.makedirs(SCRATCH, exist_ok=True)
os.chmod(SCRATCH, 0o755)  # the unreadable-file case runs as another user
RNG = np.random.default_rng(20261203)
ANY = -1  # an expected exit code: 0 or 1 (never a signal)
TIMEOUT = 90  # seconds for one run: far above what any takes; a hang fails
MAX_RSS_KB = 1_500_000  # a bomb that allocates what it declares goes far past this
SANITIZED = any(s in open(PT, "rb").read() for s in (b"AddressSanitizer", b"ThreadSanitizer"))

failures = []
rows = []  # (family, case, reader, outcome, ok)


# --- running -----------------------------------------------------------------
# This script adopts the orphans of its runs (PR_SET_CHILD_SUBREAPER), so a
# process whose parent died unreaped is its to reap, whatever this machine's
# init does: a dead one is gone, never counted as left running.
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def group_members(pgid):
    """The live processes of process group PGID: 'pid state command' each."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
            fields = st[st.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "backslashreplace").strip()
            found.append("pid %s (%s) %s" % (d, fields[0], cmd[:200]))
        except (OSError, ValueError):
            continue
    return found


def run(cmd, cwd=None, user=None):
    """Runs CMD; returns (exit code, or -signal, or None on timeout), its output and peak RSS."""
    if user is not None:
        cmd = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups", "--"] + cmd
    with open(os.path.join(SCRATCH, "run.out"), "w+b") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                             start_new_session=True)
        deadline = time.monotonic() + TIMEOUT
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.killpg(p.pid, 9)
                os.wait4(p.pid, 0)
                status, usage = None, None
                break
            time.sleep(0.01)
        p.returncode = 0  # reaped here, not by Popen
        out.seek(0)
        text = out.read().decode("utf-8", "backslashreplace")
    reap_orphans()
    left = group_members(p.pid)
    if left:  # a process group left behind (a rank, a loader serve) is a failure too
        time.sleep(1)
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        reap_orphans()
        text += "\n[corpus.py: processes of this run were still alive after it ended: %s]" % "; ".join(left)
        status = status if status is None else -999
    if status is None:
        return None, text, 0
    code = os.waitstatus_to_exitcode(status) if status != -999 else -999
    return code, text, usage.ru_maxrss


BAD_TEXT = re.compile(r"AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:|terminate called|"
                      r"Segmentation fault|core dumped|uncaught|std::bad_alloc")


def shm_entries():
    return set(os.listdir("/dev/shm"))


def check(family, case, reader, cmd, want_rc, want_re, user=None, after=None):
    """Runs one reader on one case and checks everything; WANT_RE must be found in its output."""
    before = shm_entries()
    rc, text, rss = run(cmd, user=user)
    problems = []
    if rc is None:
        problems.append("did not end within %d s (a hang)" % TIMEOUT)
    elif rc < 0:
        problems.append("ended by signal %d" % -rc if rc != -999 else "left processes running")
    elif rc != want_rc and not (want_rc == ANY and rc in (0, 1)):
        problems.append("exit %d, wanted %d" % (rc, want_rc))
    m = BAD_TEXT.search(text)
    if m:
        problems.append("output holds '%s'" % m.group(0))
    if want_re and not re.search(want_re, text):
        problems.append("output does not match /%s/" % want_re)
    if not SANITIZED and rss > MAX_RSS_KB:
        problems.append("peak RSS %d MiB" % (rss // 1024))
    left = shm_entries() - before
    if left:
        problems.append("left in /dev/shm: %s" % sorted(left))
    if after:
        problems += after()
    ok = not problems
    first = next((l for l in text.splitlines() if re.search(r"error|skipp|warning|refus|FAIL|bad", l, re.I)), "")
    if not first:
        first = text.strip().splitlines()[-1] if text.strip() else ""
    first = first.replace(SCRATCH + "/", "")  # the scratch directory's name says nothing
    rows.append((family, case, reader, "exit %s: %s" % (rc, first.strip()[:160]), ok))
    if not ok:
        failures.append("%s / %s / %s: %s\n    %s\n%s" % (family, case, reader, "; ".join(problems), " ".join(map(str, cmd)),
                                                       "\n".join("    | " + l for l in text.splitlines()[-12:])))
    if SHOW:
        print("== %s / %s / %s: exit %s, rss %d MiB\n%s" % (family, case, reader, rc, rss // 1024, text))
    return rc, text


def wanted(name):
    return ONLY is None or ONLY in name


# --- image bytes -------------------------------------------------------------
def picture(w, h):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(1, w - 1)), (y * 255 // max(1, h - 1)), ((x + y) * 7) % 256], -1)
    return Image.fromarray((img + RNG.integers(0, 40, img.shape)).clip(0, 255).astype(np.uint8))


def encoded(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


JPEG = encoded(picture(48, 40), "JPEG", quality=90)
PNG = encoded(picture(40, 32), "PNG")
SOS = JPEG.index(b"\xff\xda")
SOF = JPEG.index(b"\xff\xc0")
IDAT = PNG.index(b"IDAT") - 4


def pillow_loads(data):
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.convert("RGB")
        return True
    except Exception:
        return False


def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with(width, height, depth=8, color=2, idat=None):
    """A PNG with a valid signature and CRCs, whatever its header says."""
    if idat is None:
        rows = b"".join(b"\0" + bytes(min(width, 64) * 3) for _ in range(min(height, 4)))
        idat = zlib.compress(rows)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def inflating_png(inflated_bytes):
    """A 64x64 PNG whose image data inflates to INFLATED_BYTES (zeros): a small file, a huge stream."""
    z = zlib.compressobj(9)
    parts, block = [], bytes(1 << 22)
    for _ in range(inflated_bytes >> 22):
        parts.append(z.compress(block))
    parts.append(z.flush())
    return png_with(64, 64, idat=b"".join(parts))


def jpeg_sof(width=None, height=None, ncomp=None):
    b = bytearray(JPEG)
    if height is not None:
        b[SOF + 5:SOF + 7] = struct.pack(">H", height)
    if width is not None:
        b[SOF + 7:SOF + 9] = struct.pack(">H", width)
    if ncomp is not None:
        b[SOF + 9] = ncomp
    return bytes(b)


def png_data_flip():
    b = bytearray(PNG)
    length = struct.unpack(">I", b[IDAT:IDAT + 4])[0]
    body = IDAT + 8
    b[body + length // 2] ^= 0x10
    b[body + length:body + length + 4] = struct.pack(">I", zlib.crc32(bytes(b[IDAT + 4:body + length])))
    return bytes(b)


def gif():
    return encoded(picture(16, 16), "GIF")


# --- source cases: pack_tool imagefolder -------------------------------------
# (name, file name in class "b", bytes or a maker, expected) where expected is
# "pillow": refused with the reason exactly when Pillow refuses (else packed);
# or a regex the strict pack's error must match (then --skip-bad skips it).
IMAGE_CASES = []
for off in (1, 2, 3, 20, SOS - 5, SOS + 2, SOS + 40, len(JPEG) // 2, len(JPEG) - 40, len(JPEG) - 2):
    IMAGE_CASES.append(("jpeg cut at %d of %d" % (off, len(JPEG)), "cut%d.jpg" % off, JPEG[:off], "pillow"))
for off in (1, 8, 16, 33, IDAT + 8, IDAT + 40, len(PNG) // 2, len(PNG) - 30):
    IMAGE_CASES.append(("png cut at %d of %d" % (off, len(PNG)), "cut%d.png" % off, PNG[:off], "pillow"))
IMAGE_CASES += [
    ("jpeg SOF height 0", "h0.jpg", jpeg_sof(height=0), "pillow"),
    ("jpeg SOF width 0", "w0.jpg", jpeg_sof(width=0), "pillow"),
    ("jpeg SOF 7 components", "c7.jpg", jpeg_sof(ncomp=7), "pillow"),
    ("jpeg bit flip in DQT", "dqt.jpg", JPEG[:JPEG.index(b"\xff\xdb") + 4] + b"\x1f" + JPEG[JPEG.index(b"\xff\xdb") + 5:],
     "pillow"),
    ("jpeg bit flips in compressed data", "data.jpg",
     JPEG[:SOS + 30] + bytes(x ^ 0x5A for x in JPEG[SOS + 30:SOS + 60]) + JPEG[SOS + 60:], "pillow"),
    ("jpeg declaring 65500x65500 (bomb)", "bomb.jpg", jpeg_sof(65500, 65500), r"bomb\.jpg.*(pixel|limit|large)"),
    ("png IHDR width 0", "w0.png", png_with(0, 8), "pillow"),
    ("png IHDR bit depth 3", "d3.png", png_with(8, 8, depth=3), "pillow"),
    ("png IHDR colour type 5", "t5.png", png_with(8, 8, color=5), "pillow"),
    ("png IHDR width 2^31", "w31.png", png_with(1 << 31, 8), "pillow"),
    ("png declaring 100000x100000 (bomb)", "bomb.png", png_with(100000, 100000), r"bomb\.png.*(pixel|limit|large)"),
    ("png inflating to 1 GiB (bomb, declares 64x64)", "zbomb.png", lambda: inflating_png(1 << 30), "pillow"),
    ("png bit flip in image data, CRC fixed", "zflip.png", png_data_flip(), "pillow"),
    ("png bad CRC in IHDR", "crc.png", PNG[:29] + bytes([PNG[29] ^ 1]) + PNG[30:], "pillow"),
    ("zero-length .jpg", "empty.jpg", b"", r"empty\.jpg"),
    ("zero-length .png", "empty.png", b"", r"empty\.png"),
    ("text file named .jpg", "notes.jpg", b"these are my notes, not an image\n", r"notes\.jpg"),
    ("GIF named .jpg (unsupported)", "anim.jpg", gif(), r"anim\.jpg.*GIF"),
    ("JPEG named .png", "photo.png", JPEG, "pillow"),
    ("PNG named .jpg", "drawing.jpg", PNG, "pillow"),
    ("bad image with a non-UTF-8 name", b"caf\xe9-\xff.jpg", JPEG[:SOS], r"caf\\x[eE]9-\\x[fF]{2}\.jpg"),
]


def imagefolder_tree(root, extra):
    """Class a: two good images; class b: one good image and EXTRA (name -> bytes, or a callable making it)."""
    os.makedirs(os.path.join(root, "a"))
    os.makedirs(os.path.join(root, "b"))
    open(os.path.join(root, "a", "1.jpg"), "wb").write(JPEG)
    open(os.path.join(root, "a", "2.png"), "wb").write(PNG)
    open(os.path.join(root, "b", "0good.png"), "wb").write(PNG)
    for name, make in extra.items():
        path = os.path.join(root.encode(), b"b", name if isinstance(name, bytes) else name.encode())
        make(path)


def leftovers(out):
    """Nothing half-written: OUT absent, no temporary or lock beside it."""
    def f():
        parent = os.path.dirname(out)
        base = os.path.basename(out)
        left = [n for n in os.listdir(parent) if n.startswith(base)]
        return ["left behind: %s" % left] if left else []
    return f


def verified(out, samples, skipped_name=None):
    def f():
        problems = []
        rc, text, _ = run([PT, "verify", out])
        if rc != 0:
            problems.append("the packed set does not verify: %s" % text.strip()[-300:])
        if not os.path.exists(os.path.join(out, "manifest.json")):
            return problems + ["no shard set at %s" % out]
        m = json.load(open(os.path.join(out, "manifest.json")))
        split = m["splits"]["train"]
        if split["num_samples"] != samples:
            problems.append("%d samples packed, wanted %d" % (split["num_samples"], samples))
        if skipped_name is not None and not any(skipped_name in json.dumps(s) for s in split["skipped"]):
            problems.append("manifest's skipped list does not name %s: %s" % (skipped_name, split["skipped"]))
        return problems
    return f


def pack_case(name, fname, make, expect, user=None):
    """Strict pack: the error names the file (or the pack succeeds where Pillow loads); --skip-bad skips it."""
    root = os.path.join(SCRATCH, "src-%d" % len(rows))
    writer = make if callable(make) and not isinstance(make, bytes) else (lambda p, b=make: open(p, "wb").write(b))
    imagefolder_tree(root, {fname: writer})
    shown = fname if isinstance(fname, str) else fname.decode("latin-1")
    if expect == "pillow":
        data = open(os.path.join(root.encode(), b"b", fname if isinstance(fname, bytes) else fname.encode()), "rb").read()
        loads = pillow_loads(data)
        expect = None if loads else re.escape(shown)
    out = root + "-out"
    if expect is None:  # Pillow loads it: so must we
        check("imagefolder", name, "pack (Pillow loads: must pack)", [PT, "imagefolder", root, out, "--threads", "1"], 0,
              r"packed .*: 4 samples", user=user, after=verified(out, 4))
        return
    check("imagefolder", name, "pack (refuse, naming the file)", [PT, "imagefolder", root, out, "--threads", "1"], 1,
          expect, user=user, after=leftovers(out))
    check("imagefolder", name, "pack --skip-bad (skip, with reason)",
          [PT, "imagefolder", root, out, "--threads", "1", "--skip-bad"], 0, r"3 samples.*1 skipped", user=user,
          after=verified(out, 3, None if isinstance(fname, bytes) else fname))


def image_cases():
    for name, fname, data, expect in IMAGE_CASES:
        if not wanted(name):
            continue
        if callable(data):
            data = data()
        pack_case(name, fname, data, expect)


def tree_cases():
    """Cases of the tree itself rather than one file's bytes."""
    def fifo(p):
        os.mkfifo(p)

    def loop(p):
        os.symlink(".", p)

    def selfloop(p):
        os.symlink(os.path.basename(p), p)

    def dangling(p):
        os.symlink(b"/nonexistent/file.jpg", p)

    def subdir(p):
        os.mkdir(p)

    def unreadable(p):
        open(p, "wb").write(JPEG)
        os.chmod(p, 0)

    cases = [
        ("FIFO named .jpg", "pipe.jpg", fifo, r"pipe\.jpg"),
        # The tree itself is wrong, not one image: refused in both modes
        # (torchvision's os.walk would follow it 40 levels deep and load
        # class b's images 40 times over).
        ("symlink loop (a directory linking to itself)", "loop", loop, ("always", r"symlink loop: .*b/loop")),
        ("symlink to itself named .jpg", "self.jpg", selfloop, r"self\.jpg"),
        ("dangling symlink named .jpg", "gone.jpg", dangling, r"gone\.jpg"),
        ("directory named .jpg", "dir.jpg", subdir, None),
    ]
    for name, fname, make, expect in cases:
        if not wanted(name):
            continue
        if isinstance(expect, tuple):
            root = os.path.join(SCRATCH, "src-%d" % len(rows))
            imagefolder_tree(root, {fname: make})
            out = root + "-out"
            for mode in ([], ["--skip-bad"]):
                check("imagefolder", name, "pack %s(refuse, naming it)" % (mode[0] + " " if mode else ""),
                      [PT, "imagefolder", root, out, "--threads", "1"] + mode, 1, expect[1], after=leftovers(out))
        elif expect is None:
            root = os.path.join(SCRATCH, "src-%d" % len(rows))
            imagefolder_tree(root, {fname: make})
            out = root + "-out"
            check("imagefolder", name, "pack (nothing to read there: packs the rest)",
                  [PT, "imagefolder", root, out, "--threads", "1"], 0, r"packed .*: 3 samples", after=verified(out, 3))
        else:
            pack_case(name, fname, make, expect)
    if wanted("unreadable"):
        # Root reads any file: run as nobody, on a tree nobody may enter and an OUT it may write.
        root = os.path.join(SCRATCH, "src-unreadable")
        imagefolder_tree(root, {"secret.jpg": unreadable})
        for d, _, _ in os.walk(root):
            os.chmod(d, 0o755)
        user = 65534 if os.geteuid() == 0 else None
        outdir = os.path.join(SCRATCH, "nobody-out")
        os.makedirs(outdir, exist_ok=True)
        os.chmod(outdir, 0o777)
        out = os.path.join(outdir, "o")
        check("imagefolder", "unreadable file (mode 000)", "pack (refuse, naming the file)",
              [PT, "imagefolder", root, out, "--threads", "1"], 1, r"secret\.jpg.*(ermission|denied)", user=user,
              after=leftovers(out))
        check("imagefolder", "unreadable file (mode 000)", "pack --skip-bad (skip, with reason)",
              [PT, "imagefolder", root, out, "--threads", "1", "--skip-bad"], 0, r"3 samples.*1 skipped", user=user)
    if wanted("empty class"):
        root = os.path.join(SCRATCH, "src-emptyclass")
        imagefolder_tree(root, {})
        os.mkdir(os.path.join(root, "c"))
        out = root + "-out"
        check("imagefolder", "empty class directory", "pack (refuse, naming the class, as torchvision does)",
              [PT, "imagefolder", root, out], 1, r"\bc\b.*(no|empty)|(no|empty).*\bc\b", after=leftovers(out))
    if wanted("non-UTF-8 good"):
        root = os.path.join(SCRATCH, "src-latin")
        imagefolder_tree(root, {b"\xe9t\xe9.jpg": lambda p: open(p, "wb").write(JPEG)})
        out = root + "-out"
        check("imagefolder", "good image with a non-UTF-8 name", "pack (packs it)",
              [PT, "imagefolder", root, out], 0, r"packed .*: 4 samples", after=verified(out, 4))
    if wanted("no class"):
        root = os.path.join(SCRATCH, "src-noclass")
        os.makedirs(root)
        open(os.path.join(root, "loose.jpg"), "wb").write(JPEG)
        check("imagefolder", "no class directory (images at the top)", "pack (refuse, saying so)",
              [PT, "imagefolder", root, root + "-out"], 1, r"class", after=leftovers(root + "-out"))


# --- source cases: pack_tool cifar100 ------------------------------------------
def cifar_base(d):
    rc, text, _ = run([PT, "fake-cifar100", d, "--train", "20", "--test", "10"])
    assert rc == 0, text


def tar_of(d, path, mode, tweak=None):
    """A cifar-100-binary archive of directory D; TWEAK edits the raw tar bytes (before compression)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        t.add(d, arcname="cifar-100-binary")
    raw = bytearray(buf.getvalue())
    if tweak:
        tweak(raw)
    data = zlib.compress(bytes(raw)) if False else bytes(raw)
    if mode == "gz":
        import gzip
        data = gzip.compress(data)
    open(path, "wb").write(data)


def tar_member_size(raw, member, size_octal):
    """Sets MEMBER's declared size field and fixes the header checksum."""
    off = 0
    while off + 512 <= len(raw):
        name = bytes(raw[off:off + 100]).rstrip(b"\0").decode()
        if not name:
            break
        size = int(bytes(raw[off + 124:off + 136]).rstrip(b"\0 ") or b"0", 8)
        if name.endswith(member):
            raw[off + 124:off + 136] = size_octal
            raw[off + 148:off + 156] = b"        "
            raw[off + 148:off + 156] = b"%06o\0 " % sum(raw[off:off + 512])
            return
        off += 512 + (size + 511) // 512 * 512
    raise AssertionError("no member " + member)


def cifar_cases():
    base = os.path.join(SCRATCH, "cifar-base")
    cifar_base(base)
    n = [0]

    def case(name, edit, expect, src_kind="dir"):
        if not wanted(name):
            return
        n[0] += 1
        d = os.path.join(SCRATCH, "cifar-%d" % n[0])
        shutil.copytree(base, d)
        src = edit(d) or d
        out = d + "-out"
        check("cifar100", name, "pack (refuse, naming the file)", [PT, "cifar100", src, out, "--threads", "1"], 1,
              expect, after=leftovers(out))

    def cut(name, size):
        def f(d):
            p = os.path.join(d, name)
            with open(p, "r+b") as fh:
                fh.truncate(size)
        return f

    def label(d):
        b = bytearray(open(os.path.join(d, "train.bin"), "rb").read())
        b[3074 * 7 + 1] = 200  # record 7's fine label
        open(os.path.join(d, "train.bin"), "wb").write(b)

    def names(d):
        p = os.path.join(d, "fine_label_names.txt")
        kept = open(p).read().split()[:99]
        open(p, "w").write("\n".join(kept) + "\n")

    def remove(name):
        return lambda d: os.remove(os.path.join(d, name))

    def archive(mode, tweak=None, post=None):
        def f(d):
            path = d + (".tar.gz" if mode == "gz" else ".tar")
            tar_of(d, path, mode, tweak)
            if post:
                post(path)
            return path
        return f

    def half(path):
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 2)

    case("train.bin not a multiple of 3074 bytes", cut("train.bin", 3074 * 5 + 100), r"train\.bin")
    case("train.bin zero length", cut("train.bin", 0), r"train\.bin")
    case("test.bin missing", remove("test.bin"), r"test\.bin")
    case("fine label 200 (out of range)", label, r"train\.bin.*(record|sample|index) 7|label 200")
    case("fine_label_names.txt with 99 names", names, r"fine_label_names\.txt.*99")
    case("archive member declaring 8 GiB", archive("gz", lambda r: tar_member_size(r, "train.bin", b"77777777777\0")),
         r"train\.bin")
    case("plain tar member declaring 8 GiB", archive("tar", lambda r: tar_member_size(r, "train.bin", b"77777777777\0")),
         r"train\.bin")
    case(".tar.gz cut in half", archive("gz", post=half), r"\.tar\.gz")
    case("text file named .tar.gz", lambda d: (open(d + ".tar.gz", "w").write("not an archive\n"), d + ".tar.gz")[1],
         r"\.tar\.gz")


# --- shard-set cases --------------------------------------------------------------
SAMPLES = 12


def base_set():
    """A shard set of 12 samples (JPEG and PNG records) in two shards of 6."""
    src = os.path.join(SCRATCH, "set-src")
    for c in ("a", "b"):
        os.makedirs(os.path.join(src, c))
        for i in range(6):
            data = JPEG if i % 2 else PNG
            open(os.path.join(src, c, "%d.%s" % (i, "jpg" if i % 2 else "png")), "wb").write(data)
    out = os.path.join(SCRATCH, "set-base")
    rc, text, _ = run([PT, "imagefolder", src, out, "--shards", "2"])
    assert rc == 0, text
    return out


def rewrite_shard(d, shard, edit):
    """Rewrites one shard's records (EDIT maps the list of (key, value)) and fixes the manifest's checksum,
    bytes and count, so only the record-level lie is left."""
    path = os.path.join(d, "train", "shard-%05d" % shard)
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        items = list(txn.cursor())
    env.close()
    items = edit(items)
    shutil.rmtree(path)
    os.makedirs(path)
    env = lmdb.open(path, map_size=1 << 26, lock=False)
    crc = 0
    with env.begin(write=True) as txn:
        for k, v in items:
            txn.put(k, v)
    with env.begin() as txn:
        for k, v in txn.cursor():
            crc = crc32c(k + v, crc)
    env.sync(True)
    env.close()
    m = json.load(open(os.path.join(d, "manifest.json")))
    sh = m["splits"]["train"]["shards"][shard]
    sh["checksum"] = "crc32c:%08x" % crc
    sh["bytes"] = os.path.getsize(os.path.join(path, "data.mdb"))
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))


def replace_record(index, value):
    def edit(items):
        return [(k, value if struct.unpack(">Q", k)[0] == index else v) for k, v in items]
    return edit


def manifest_edit(fn):
    def f(d):
        p = os.path.join(d, "manifest.json")
        m = json.load(open(p))
        fn(m)
        json.dump(m, open(p, "w"))
    return f


def data_mdb(d, shard=0):
    return os.path.join(d, "train", "shard-%05d" % shard, "data.mdb")


def flip_at(offset_of):
    def f(d):
        p = data_mdb(d)
        b = bytearray(open(p, "rb").read())
        off = offset_of(bytes(b))
        b[off] ^= 0x40
        open(p, "wb").write(b)
    return f


def payload_offset(b):
    """The middle of the first record's payload in the file."""
    i = b.index(b"NLRC")
    return i + 32 + 40


def header_offset(b):
    return b.index(b"NLRC") + 14  # the width field


def shard_cases():
    base = base_set()
    n = [0]
    shards = json.load(open(os.path.join(base, "manifest.json")))["splits"]["train"]["shards"]
    png_record_of_index_1 = None

    def case(name, edit, expect, loaders_expect=None, record_level=False, verify_expect=None):
        """EXPECT: regex every reader's error must match; LOADERS_EXPECT: (rc, regex) for the loaders when
        they differ from verify (a damage only verify's whole-file checks see)."""
        if not wanted(name):
            return
        n[0] += 1
        d = os.path.join(SCRATCH, "set-%d" % n[0])
        shutil.copytree(base, d, symlinks=True)
        edit(d)
        v_rc, v_re = verify_expect or (1, expect)
        check("shard set", name, "pack_tool verify", [PT, "verify", d, "--threads", "1"], v_rc, v_re)
        l_rc, l_re = loaders_expect or (1, expect)
        prev = d + "-preview"

        def preview_output():
            bad = []
            for f in os.listdir(prev) if os.path.isdir(prev) else []:
                try:
                    with Image.open(os.path.join(prev, f)) as im:
                        im.load()
                except Exception as e:
                    bad.append("%s: %s" % (f, e))
            return ["half-written preview output: %s" % bad] if bad else []
        check("shard set", name, "loader preview",
              [LOADER, "preview", "--data", d, "--indices", ",".join(map(str, range(SAMPLES))), "--out", prev,
               "--image-size", "32"], l_rc, l_re, after=preview_output)
        common = [LB, "--data", d, "--ranks", "1", "--epochs", "1", "--batch-size", "4", "--bind", "off",
                  "--no-shuffle", "--image-size", "32", "--threads-per-rank", "1"]
        check("shard set", name, "loader_bench (in process)", common, l_rc, l_re)
        check("shard set", name, "loader_bench --mode service", common + ["--mode", "service"], l_rc, l_re)
        if record_level:
            check("shard set", name, "loader_bench --on-bad-record skip (replaced and counted)",
                  common + ["--on-bad-record", "skip", "--json"], 0, r'"skipped": *[1-9]')

    # the manifest
    case("manifest.json missing", lambda d: os.remove(os.path.join(d, "manifest.json")), r"manifest\.json")
    case("manifest.json empty", lambda d: open(os.path.join(d, "manifest.json"), "w").close(), r"manifest\.json")
    case("manifest.json cut in half", lambda d: open(os.path.join(d, "manifest.json"), "r+").truncate(
        os.path.getsize(os.path.join(d, "manifest.json")) // 2), r"manifest\.json")
    case("manifest.json a JSON array", lambda d: open(os.path.join(d, "manifest.json"), "w").write("[1, 2]"),
         r"manifest\.json")
    case("num_samples 13 (shards hold 12)", manifest_edit(lambda m: m["splits"]["train"].update(num_samples=13)),
         r"num_samples|13")
    case("num_samples a string", manifest_edit(lambda m: m["splits"]["train"].update(num_samples="12")),
         r"num_samples")
    case("num_samples 2^64", manifest_edit(lambda m: m["splits"]["train"].update(num_samples=1 << 64)),
         r"num_samples")
    case("shards an object", manifest_edit(lambda m: m["splits"]["train"].update(shards={"a": 1})), r"shards")
    case("first_index -6", manifest_edit(lambda m: m["splits"]["train"]["shards"][1].update(first_index=-6)),
         r"first_index")
    case("first_index leaves a gap", manifest_edit(lambda m: m["splits"]["train"]["shards"][1].update(first_index=7)),
         r"starts at index 7, expected 6")

    def longer(m):
        m["splits"]["train"]["shards"][0]["count"] = 7
        m["splits"]["train"]["shards"][1]["first_index"] = 7
        m["splits"]["train"]["shards"][1]["count"] = 5
    case("shard count 7 (it holds 6)", manifest_edit(longer), r"shard-00000")
    case("format_version 2", manifest_edit(lambda m: m.update(format_version=2)), r"format_version|version 2")
    case("classes empty", manifest_edit(lambda m: m.update(classes=[])), r"class list is empty")
    case("one class (labels 1 out of range)", manifest_edit(lambda m: m.update(classes=["a"])), r"label")
    case("shard path ../../escape", manifest_edit(
        lambda m: m["splits"]["train"]["shards"][0].update(path="../" + os.path.basename(base) + "/train/shard-00000")),
        r"\.\.")
    case("shard path absolute", manifest_edit(
        lambda m: m["splits"]["train"]["shards"][0].update(path=os.path.join(base, "train/shard-00000"))),
        r"unsafe path.*must be relative")
    case("shard path with a NUL", manifest_edit(
        lambda m: m["splits"]["train"]["shards"][0].update(path="train/shard-00000\0x")), r"path")
    case("checksum wrong in the manifest", manifest_edit(
        lambda m: m["splits"]["train"]["shards"][1].update(checksum="crc32c:00000000")), r"shard-00001.*checksum",
        loaders_expect=(0, r""))
    case("bytes wrong in the manifest", manifest_edit(
        lambda m: m["splits"]["train"]["shards"][1].update(bytes=shards[1]["bytes"] + 4096)), r"shard-00001")
    # the files
    case("shard directory missing", lambda d: shutil.rmtree(os.path.join(d, "train", "shard-00001")),
         r"shard-00001")
    case("data.mdb missing", lambda d: os.remove(data_mdb(d, 1)), r"shard-00001")
    case("data.mdb zero length", lambda d: open(data_mdb(d, 1), "w").close(), r"shard-00001")
    case("data.mdb cut in half", lambda d: open(data_mdb(d, 1), "r+").truncate(shards[1]["bytes"] // 2), r"shard-00001")
    case("data.mdb cut by one page", lambda d: open(data_mdb(d, 1), "r+").truncate(shards[1]["bytes"] - 4096),
         r"shard-00001")
    case("data.mdb a FIFO", lambda d: (os.remove(data_mdb(d, 1)), os.mkfifo(data_mdb(d, 1))), r"shard-00001")
    case("data.mdb a directory", lambda d: (os.remove(data_mdb(d, 1)), os.mkdir(data_mdb(d, 1))), r"shard-00001")
    case("a byte flipped in a record's payload", flip_at(payload_offset), r"shard-00000.*index \d+.*checksum")
    case("a byte flipped in a record's header", flip_at(header_offset), r"shard-00000.*index \d+.*checksum")
    case("LMDB meta pages' magic flipped", flip_at(lambda b: 16) if False else
         (lambda d: [flip_at(lambda b: off)(d) for off in (16, 4096 + 16)]), r"shard-00000")
    # Bytes of LMDB's own pages (page 2 and 3: the tree's pages; their header
    # fields, node offsets, node sizes): LMDB trusts them, so the readers must
    # check what it hands back. A flip in a byte LMDB does not use changes
    # nothing (verify's checksum over every record then proves it).
    for off in [4096 * p + f for p in (2, 3) for f in (10, 12, 14, 16, 18, 20, 22, 24)]:
        case("a byte flipped in an LMDB page at %d" % off, flip_at(lambda b, o=off: o), r"shard-00000",
             verify_expect=(ANY, r"shard-00000|0 problems"), loaders_expect=(ANY, r"shard-00000|images/s|wrote"))
    # records whose checksums are valid but whose fields lie
    case("record: header 40x48, JPEG is 48x40", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, w=40, h=48))),
         r"shard-00000.*(index|record|sample) 1.*(48|40)", record_level=True)
    case("record: label 5 of 2 classes", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, label=5))),
         r"(index|record|sample) 1.*label", record_level=True)
    case("record: length field 100 over the payload",
         lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, length=len(JPEG) + 100))),
         r"(index|record|sample) 1.*length", record_level=True)
    case("record: encoding 7", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, enc=7))),
         r"(index|record|sample) 1.*encoding", record_level=True)
    case("record: raw, payload not w x h x 3",
         lambda d: rewrite_shard(d, 0, replace_record(1, record(bytes(100), enc=0, w=48, h=40))),
         r"(index|record|sample) 1", record_level=True)
    case("record: 1 channel", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, channels=1))),
         r"(index|record|sample) 1.*channel", record_level=True)
    case("record: version 2", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, version=2))),
         r"(index|record|sample) 1.*version", record_level=True)
    case("record: magic XXXX", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, magic=b"XXXX"))),
         r"(index|record|sample) 1.*magic", record_level=True)
    case("record: header 1048576 x 1048576 (bomb)",
         lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG, w=1 << 20, h=1 << 20))),
         r"(index|record|sample) 1", record_level=True)
    case("record: truncated JPEG payload", lambda d: rewrite_shard(d, 0, replace_record(1, record(JPEG[:SOS + 20]))),
         r"(index|record|sample) 1", record_level=True)
    case("record: text as JPEG payload", lambda d: rewrite_shard(d, 0, replace_record(1, record(b"hello" * 20))),
         r"(index|record|sample) 1", record_level=True)
    # The format is found from the payload's magic bytes, as Pillow finds it:
    # a PNG in a record that says JPEG loads.
    case("record: PNG payload, encoding says JPEG", lambda d: rewrite_shard(d, 0, replace_record(1, record(PNG, w=40, h=32))),
         r"", verify_expect=(0, r"0 problems"), loaders_expect=(0, r""))
    case("record: 10-byte value", lambda d: rewrite_shard(d, 0, replace_record(1, b"NLRC\1\0\2\3ab")),
         r"(index|record|sample) 1", record_level=True)
    case("record: empty value", lambda d: rewrite_shard(d, 0, replace_record(1, b"")),
         r"(index|record|sample) 1", record_level=True)
    case("record: key 2 missing (keys 0,1,3..)",
         lambda d: rewrite_shard(d, 0, lambda items: [(struct.pack(">Q", 6 if struct.unpack(">Q", k)[0] == 2 else
                                                                   struct.unpack(">Q", k)[0]), v) for k, v in items]),
         r"(index|record|sample) 2", record_level=True)
    case("record: 4-byte keys", lambda d: rewrite_shard(d, 0, lambda items: [(k[4:], v) for k, v in items]),
         r"shard-00000")


def lmdb_sweep():
    """Every 4th byte of both meta pages' used part and of the first tree pages' headers and node
    tables, flipped one at a time: verify and the in-process loader end by exit (0 when the byte is
    not in use: verify's checksum over every record then proves the records unchanged), never by a
    signal."""
    if not wanted("LMDB sweep"):
        return
    base = os.path.join(SCRATCH, "set-base")
    size = os.path.getsize(data_mdb(base))
    offsets = [o for o in range(0, 160, 4)] + [4096 + o for o in range(0, 160, 4)]
    offsets += [4096 * p + o for p in range(2, min(size // 4096, 6)) for o in range(8, 96, 4)]
    for off in offsets:
        d = os.path.join(SCRATCH, "sweep")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        flip_at(lambda b: off)(d)
        name = "LMDB sweep: byte %d flipped" % off
        check("LMDB byte sweep", name, "pack_tool verify --quick", [PT, "verify", "--quick", d], ANY,
              r"shard-00000|0 problems")
        check("LMDB byte sweep", name, "loader_bench (in process)",
              [LB, "--data", d, "--ranks", "1", "--epochs", "1", "--batch-size", "4", "--bind", "off",
               "--image-size", "32", "--threads-per-rank", "1"], ANY, r"shard-00000|images/s")


def report():
    fams = {}
    for fam, case, reader, outcome, ok in rows:
        f = fams.setdefault(fam, [set(), 0, 0])
        f[0].add(case)
        f[1] += 1
        f[2] += ok
    lines = ["| input family | inputs | runs | held |", "|---|---:|---:|---:|"]
    for fam, (cases, runs, good) in fams.items():
        lines.append("| %s | %d | %d | %d |" % (fam, len(cases), runs, good))
    total_cases = sum(len(c) for c, _, _ in fams.values())
    lines.append("| **all** | **%d** | **%d** | **%d** |" % (total_cases, len(rows), sum(r[4] for r in rows)))
    detail = ["| input | reader | outcome |", "|---|---|---|"]
    for fam, case, reader, outcome, ok in rows:
        detail.append("| %s: %s | %s | %s%s |" % (fam, case.replace("|", "/"), reader,
                                                   "" if ok else "**FAILED** ", outcome.replace("|", "/")))
    return "\n".join(lines), "\n".join(detail), total_cases


if __name__ == "__main__":
    t0 = time.time()
    image_cases()
    tree_cases()
    cifar_cases()
    shard_cases()
    lmdb_sweep()
    summary, detail, total = report()
    print(summary)
    if REPORT:
        open(REPORT, "w").write(summary + "\n")
    if DETAIL:
        open(DETAIL, "w").write(detail + "\n")
    for f in failures:
        print("FAIL - " + f)
    print("%d inputs, %d runs, %d failed, %.0f s" % (total, len(rows), len(failures), time.time() - t0))
    sys.exit(1 if failures else 0)
