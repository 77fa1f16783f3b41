"""numa_loader.Loader against real `loader serve` processes it starts itself.

Usage: loader_test.py PACK_TOOL LOADER PYTHON_DIR [--part torch|plain] [unittest names]
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

PACK_TOOL, LOADER, PYDIR = sys.argv[1:4]
sys.path.insert(0, PYDIR)
os.environ["NUMA_LOADER_BIN"] = LOADER
for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_RUN_ID", "NUMA_LOADER_LIB"):
    os.environ.pop(v, None)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import numa_loader  # noqa: E402
from numa_loader import Loader, LoaderError  # noqa: E402

WORK = tempfile.mkdtemp(prefix="nl-loader-test-")
# Under AddressSanitizer (the build preloads its runtime into Python) the
# runs whose time is LibTorch's training and torchrun's (uninstrumented) are
# left out, as scripts/test.sh --sanitize leaves out the trainer's end-to-end
# runs; every other build runs them.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")
LIBTORCH_BOUND = unittest.skipIf(SANITIZED, "LibTorch- and torchrun-bound: run in the optimized build")
DATA = os.path.join(WORK, "p")
SMALL = dict(batch_size=16, image_size=32, threads=1, no_bind=True, quiet=True)


def data_4k():
    """A shard set of 4,000 samples (made once): big enough that a rank's share
    holds blocks of several samples, whose size io_memory then sets."""
    data = os.path.join(WORK, "p4k")
    if not os.path.exists(data):
        subprocess.run([PACK_TOOL, "fake-cifar100", WORK + "/c4k", "--train", "4000", "--test", "10"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([PACK_TOOL, "cifar100", WORK + "/c4k", data], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return data


def setUpModule():
    subprocess.run([PACK_TOOL, "fake-cifar100", WORK + "/c", "--train", "200", "--test", "10"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([PACK_TOOL, "cifar100", WORK + "/c", DATA], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tearDownModule():
    subprocess.run(["rm", "-rf", WORK], check=False)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped) counts as gone.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


class OptionsTest(unittest.TestCase):
    def test_every_keyword_is_a_serve_flag_with_its_default(self):
        out = subprocess.run([LOADER, "serve", "--help"], capture_output=True, text=True).stdout
        flags = {}
        for m in re.finditer(r"^\s+--([a-z-]+)(?: (TEXT|UINT|INT|FLOAT)[^ =\n]*(?: in \[[^\]]*\])?(?:=(\S+))?)?", out,
                             re.M):
            flags[m.group(1)] = (m.group(2), m.group(3))
        for name, (kind, default) in numa_loader.loader.SERVE_OPTIONS.items():
            flag = name.replace("_", "-")
            self.assertIn(flag, flags, "loader serve has no --%s" % flag)
            typ, shown = flags[flag]
            if kind == "flag":
                self.assertIsNone(typ, "--%s takes a value" % flag)
                self.assertIs(default, False)
            elif default is None:
                self.assertIsNone(shown, "--%s has a default, %s" % (flag, shown))
            else:
                self.assertEqual(str(default), str(float(shown) if kind == "float" else shown),
                                 "--%s's default" % flag)
        # The transform and order flags all have their keyword.
        for flag in ("order", "io-memory", "augment", "random-resized-crop", "decode", "normalize",
                     "mean", "std", "resize", "pad-crop", "no-flip", "layout"):
            self.assertIn(flag.replace("-", "_"), numa_loader.loader.SERVE_OPTIONS)

    def test_the_keywords_defaults_and_ranges_come_from_the_binary(self):
        table = json.loads(subprocess.run([LOADER, "serve", "--options-json"], capture_output=True,
                                          check=True).stdout)
        options, ranges, choices = numa_loader.loader.serve_options(LOADER)
        managed = set(numa_loader.loader._MANAGED)
        self.assertEqual(list(options), [o["field"] for o in table if o["field"] not in managed])
        for o in table:
            if o["field"] in managed:
                continue
            self.assertEqual(options[o["field"]][1], o["default"], o["field"])
        self.assertEqual(choices["order"], ("random", "blocks", "auto"))
        # A loader whose table differs: the package follows it (no copy of its own).
        fake = os.path.join(WORK, "fake-loader")
        for o in table:
            if o["field"] == "batch_size":
                o["default"], o["max"] = 7, 9
        with open(fake, "w") as f:
            f.write("#!/bin/sh\ncat <<'EOF'\n%s\nEOF\n" % json.dumps(table))
        os.chmod(fake, 0o755)
        options, ranges, _ = numa_loader.loader.serve_options(fake)
        self.assertEqual(options["batch_size"], ("int", 7))
        self.assertEqual(ranges["batch_size"], (1, 9))
        # A table whose entry lacks a key (a crafted or foreign binary): LoaderError, not KeyError.
        crafted = os.path.join(WORK, "crafted-loader")
        with open(crafted, "w") as f:
            f.write("#!/bin/sh\necho '[{\"field\": \"batch_size\", \"kind\": \"int\"}]'\n")
        os.chmod(crafted, 0o755)
        with self.assertRaisesRegex(LoaderError, "crafted-loader serve --options-json: an entry is "
                                                 "not an option"):
            numa_loader.loader.serve_options(crafted)
        # One that cannot say: LoaderError naming it.
        broken = os.path.join(WORK, "broken-loader")
        with open(broken, "w") as f:
            f.write("#!/bin/sh\necho 'unknown option' >&2\nexit 109\n")
        os.chmod(broken, 0o755)
        with self.assertRaisesRegex(LoaderError, "broken-loader serve --options-json did not print "
                                                 "its options \\(exit 109\\): unknown option"):
            numa_loader.loader.serve_options(broken)

    def test_bad_arguments_are_refused_before_a_server_starts(self):
        with self.assertRaisesRegex(ValueError, "order must be 'random', 'blocks' or 'auto', not 'sequential'"):
            Loader(DATA, order="sequential")
        with self.assertRaisesRegex(TypeError, "unknown keyword argument batchsize"):
            Loader(DATA, batchsize=3)
        with self.assertRaisesRegex(TypeError, "augment must be True or False"):
            Loader(DATA, augment="yes")
        with self.assertRaisesRegex(TypeError, "batch_size must be a whole number"):
            Loader(DATA, batch_size=1.5)
        with self.assertRaisesRegex(ValueError, "mean holds nan"):
            Loader(DATA, mean=[0.5, float("nan"), 0.5])
        with self.assertRaisesRegex(ValueError, "rank 2 is not within a world of 2"):
            Loader(DATA, rank=2, world_size=2)
        with self.assertRaisesRegex(ValueError, "NUL"):
            Loader(DATA, job_id="a\0b")
        with self.assertRaisesRegex(LoaderError, "cannot read .*nowhere/manifest.json"):
            Loader(os.path.join(WORK, "nowhere"))
        with self.assertRaisesRegex(ValueError, "mean holds '', not a number"):
            Loader(DATA, mean="1,,2")
        with self.assertRaisesRegex(ValueError, "mean is empty"):
            Loader(DATA, mean=[])
        with self.assertRaisesRegex(ValueError, "gpus holds 'a', not a whole number"):
            Loader(DATA, gpus="a")
        with self.assertRaisesRegex(ValueError, "timeout_s must be more than 0 and finite"):
            Loader(DATA, timeout_s=float("nan"))
        with self.assertRaisesRegex(ValueError, "start_timeout_s must be more than 0"):
            Loader(DATA, start_timeout_s=-1)
        # Past what a wait can take (OverflowError before) or loader serve's
        # --attach-timeout (the server refused it before): refused here.
        with self.assertRaisesRegex(ValueError, "timeout_s must be more than 0 and finite, at most 1e"):
            Loader(DATA, timeout_s=1e300)
        with self.assertRaisesRegex(ValueError, "start_timeout_s must be more than 0 and finite, at most 1e"):
            Loader(DATA, start_timeout_s=1e9)

    def test_numeric_keywords_are_held_to_the_servers_ranges(self):
        # Issue 29 item 10: batch_size=-1 was "outside 0 .. 1099511627776".
        with self.assertRaisesRegex(ValueError, r"^batch_size -1 is outside 1 \.\. 1048576$"):
            Loader(DATA, batch_size=-1)
        ranges = numa_loader.loader.SERVE_RANGES
        numeric = [n for n, (kind, _) in numa_loader.loader.SERVE_OPTIONS.items()
                   if kind in ("int", "float", "size", "ints", "floats")]
        self.assertEqual(sorted(ranges), sorted(numeric), "every numeric keyword has its range")
        # Where --help shows the flag's range, it is this one.
        out = subprocess.run([LOADER, "serve", "--help"], capture_output=True, text=True).stdout
        shown = {m.group(1).replace("-", "_"): (float(m.group(2)), float(m.group(3))) for m in
                 re.finditer(r"^\s+--([a-z-]+) \S+ in \[(\S+) - (\S+)\]", out, re.M)}
        for name, (lo, hi) in ranges.items():
            if name in shown:
                self.assertEqual((float(lo), float(hi)), shown[name], "--%s's range" % name)
        # Just outside each range: refused before a server starts, naming the range.
        for name, (lo, hi) in ranges.items():
            kind = numa_loader.loader.SERVE_OPTIONS[name][0]
            for bad in (lo - 1, hi + 1):
                if kind in ("float", "floats"):
                    bad = lo - 0.5 if bad < lo else hi * 2
                value = [bad] if kind in ("ints", "floats") else bad
                with self.assertRaisesRegex(ValueError, "%s .*outside %s \\.\\. %s" % (
                        name, re.escape("%g" % lo if kind in ("float", "floats") else str(lo)),
                        re.escape("%g" % hi if kind in ("float", "floats") else str(hi)))):
                    Loader(DATA, **{name: value})
        for name, value, want in (("world_size", 2**20 + 1, "world_size 1048577 is outside 1 .. 1048576"),
                                  ("local_world_size", 1025, "outside 1 .. 1024"),
                                  ("local_rank", 1024, "outside 0 .. 1023")):
            with self.assertRaisesRegex(ValueError, want):
                Loader(DATA, **{name: value})

    def test_the_longest_timeouts_are_taken(self):
        with Loader(DATA, timeout_s=1e7, start_timeout_s=1e7, **SMALL) as loader:
            self.assertEqual(len(list(loader)), 13)

    def test_a_failed_start_stops_the_server_before_raising(self):
        with self.assertRaisesRegex(LoaderError, "did not start serving") as cm:
            Loader(DATA, start_timeout_s=1e-6, **SMALL)
        pid = int(re.search(r"\(pid (\d+)\)", str(cm.exception)).group(1))
        self.assertTrue(wait_gone(pid, 0.5), "the server outlives the failed Loader()")

    def test_a_server_started_off_the_main_thread_ends_when_no_consumer_comes(self):
        # Python dies (SIGKILL) before the Loader attached, in a thread of its
        # own: no parent-death signal there; --attach-timeout ends the server.
        code = ("import os, subprocess, threading, time, numa_loader, numa_loader.loader as L\n"
                "def never(*a, **k):\n"
                "    time.sleep(0.2)\n"
                "    raise numa_loader.LoaderError('not yet')\n"
                "L.Client = never\n"
                "pids = []\n"
                "popen = subprocess.Popen\n"
                "def rec(*a, **k):\n"
                "    p = popen(*a, **k)\n"
                "    pids.append(p.pid)\n"
                "    return p\n"
                "subprocess.Popen = rec\n"
                "def run():\n"
                "    try:\n"
                "        numa_loader.Loader(%r, start_timeout_s=2, batch_size=16, threads=1,\n"
                "                           no_bind=True, quiet=True)\n"
                "    except Exception:\n"
                "        pass\n"
                "threading.Thread(target=run, daemon=True).start()\n"
                "while not pids:\n"
                "    time.sleep(0.02)\n"
                "print(pids[0], flush=True)\n"
                "os.kill(os.getpid(), 9)\n" % DATA)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=PYDIR), timeout=60)
        pid = int(p.stdout.split()[0])
        self.assertTrue(wait_gone(pid, 20), "server %d waits for a consumer forever" % pid)

    def test_a_setting_the_server_refuses_is_raised_with_its_words(self):
        t0 = time.monotonic()
        with self.assertRaisesRegex(LoaderError, "exited with status .* before it served:\n.*"
                                    "--resize-size 40 needs --resize shorter-crop"):
            Loader(DATA, image_size=32, resize_size=40, quiet=True, no_bind=True)
        self.assertLess(time.monotonic() - t0, 30)


class OneRankTest(unittest.TestCase):
    def test_epochs_unpack_as_tensors_and_follow_set_epoch(self):
        with Loader(DATA, seed=3, **SMALL) as loader:
            self.assertEqual(len(loader), 13)  # 200 samples, batches of 16
            seen = []
            for x, y in loader:
                self.assertIsInstance(x, torch.Tensor)
                self.assertEqual(x.dtype, torch.uint8)
                self.assertEqual(tuple(x.shape[1:]), (3, 32, 32))
                self.assertEqual(y.dtype, torch.int64)
                seen.append(len(y))
            self.assertEqual(seen, [16] * 12 + [8])
            loader.set_epoch(1)
            e1 = [b.indices.tolist() for b in loader]
            loader.set_epoch(0)
            e0 = [b.indices.tolist() for b in loader]
            self.assertEqual(sorted(sum(e0, [])), list(range(200)), "an epoch is every sample once")
            self.assertEqual(sorted(sum(e1, [])), list(range(200)))
            self.assertNotEqual(e0, e1, "set_epoch(1) gives another shuffle")
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                again = [b.indices.tolist() for b in loader]
            self.assertEqual(again, e0, "without set_epoch the epoch repeats, as DistributedSampler")
            self.assertTrue(any("set_epoch" in str(x.message) for x in w))
            b = next(iter(loader))
            self.assertEqual((b.epoch, b.batch), (0, 0))
            x, y = b
            self.assertIs(x, b.x)
            first = x.clone()
            x[:] = 7  # the caller's own: nothing reaches the ring
            self.assertTrue(torch.equal(next(iter(loader)).x, first))

    def test_tensors_kept_and_their_views_outlive_the_memory_reused_for_later_batches(self):
        with Loader(DATA, seed=3, **SMALL) as loader:
            it = iter(loader)
            a, b = next(it), next(it)
            whole, whole_was = a.x, a.x.clone()
            part, part_was = b.x[2:5], b.x[2:5].clone()  # only a view of b's tensor is kept
            del a, b
            for _ in range(3):
                for x, y in it:
                    x.fill_(255)  # the caller's to change
                loader.set_epoch(loader.epoch + 1)
                it = iter(loader)
            self.assertTrue(torch.equal(whole, whole_was), "a kept batch was overwritten")
            self.assertTrue(torch.equal(part, part_was), "a kept view was overwritten")
            self.assertLessEqual(len(loader._pool._free.get(((16, 3, 32, 32), "|u1"), [])), 4)

    def test_batches_equal_a_client_of_a_server_given_the_same_flags(self):
        opts = dict(SMALL, seed=9, augment=True, normalize=True)
        with Loader(DATA, **opts) as loader:
            mine = [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]
        job = "loader-test-ref-%d" % os.getpid()
        server = subprocess.Popen([LOADER, "serve", "--data", DATA, "--job-id", job, "--batch-size",
                                   "16", "--image-size", "32", "--threads", "1", "--no-bind",
                                   "--seed", "9", "--augment", "--normalize", "--epochs", "1"],
                                  stderr=subprocess.DEVNULL)
        try:
            with numa_loader.Client(job, 0, timeout_s=60) as c:
                ref = [(np.array(b.pixels), np.array(b.labels)) for b in c]
        finally:
            server.wait(60)
        self.assertEqual(len(mine), len(ref))
        for (a, al), (b, bl) in zip(mine, ref):
            self.assertEqual(a.dtype, np.float32)
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(al, bl)

    def test_state_dict_resumes_mid_epoch(self):
        with Loader(DATA, seed=5, **SMALL) as loader:
            loader.set_epoch(2)
            full = [b.indices.tolist() for b in loader]
            loader.set_epoch(2)
            it = iter(loader)
            for _ in range(5):
                next(it)
            state = loader.state_dict()
        self.assertEqual((state["epoch"], state["batch"]), (2, 5))
        with Loader(DATA, seed=5, **SMALL) as again:
            again.load_state_dict(json.loads(json.dumps(state)))
            again.set_epoch(2)  # the usual loop's call keeps the resume point
            rest = [b.indices.tolist() for b in again]
            self.assertEqual(rest, full[5:])
            self.assertEqual(len([b for b in again]), 13, "the next iter() is a whole epoch")
            mid = iter(again)
            next(mid)
            self.assertEqual(again.state_dict()["batch"], 1)
            self.assertEqual(len(list(iter(again))), 13, "a new iter() after a break starts over")
            with self.assertRaisesRegex(LoaderError, "replaced by a later iter"):
                next(mid)
            with self.assertRaisesRegex(ValueError, "batches an epoch"):
                again.load_state_dict(dict(state, batches_per_epoch=7))
            with self.assertRaisesRegex(TypeError, "batches_per_epoch must be a whole number"):
                again.load_state_dict(dict(state, batches_per_epoch="13"))
            self.assertEqual(again.state_dict()["batch"], 13, "a finished epoch says so")
            again.load_state_dict(again.state_dict())
            self.assertEqual(list(again), [], "nothing is left of a finished epoch")
            again.set_epoch(3)
            self.assertEqual(len(list(again)), 13)
            with self.assertRaisesRegex(ValueError, "batch 14 is outside"):
                again.load_state_dict(dict(state, batch=14))

    def test_a_state_from_another_sequence_of_samples_is_refused(self):
        # Issue 29 item 2: a state of order="random" loaded into order="blocks"
        # was taken, and the resumed epoch repeated and missed samples.
        def saved(**kw):
            with Loader(DATA, **dict(SMALL, **kw)) as loader:
                it = iter(loader)
                next(it)
                return json.loads(json.dumps(loader.state_dict()))
        blocks = r"blocks \(blocks of (\d+) samples, (\d+) a window\)"
        random_state = saved(order="random", seed=5)
        with Loader(DATA, order="blocks", io_memory="64M", seed=5, **SMALL) as loader:
            with self.assertRaisesRegex(ValueError, "order: the state was saved with random; "
                                        "this Loader reads " + blocks):
                loader.load_state_dict(random_state)
            blocks_state = json.loads(json.dumps(loader.state_dict()))
            loader.load_state_dict(blocks_state)  # its own
            # A state of an earlier numa_loader (no order) resumes in random order
            # only (its sequence is as it was then); blocks were sized otherwise.
            with self.assertRaisesRegex(ValueError, r"order: the state does not say its order \(saved "
                                        r"by an earlier numa_loader, which sized blocks otherwise\); "
                                        r"this Loader reads blocks \(blocks of"):
                loader.load_state_dict({k: random_state[k] for k in ("epoch", "batch", "data")})
        # The same order with other blocks (another io_memory) is another sequence
        # (where a rank's share holds more than one window of the smaller).
        with Loader(data_4k(), order="blocks", io_memory="64M", seed=5, **SMALL) as loader:
            next(iter(loader))
            blocks_state = json.loads(json.dumps(loader.state_dict()))
        with Loader(data_4k(), order="blocks", io_memory="4M", seed=5, **SMALL) as loader:
            with self.assertRaises(ValueError) as cm:
                loader.load_state_dict(blocks_state)
            m = re.search("order: the state was saved with %s; this Loader reads %s"
                          % (blocks, blocks), str(cm.exception))
            self.assertTrue(m, str(cm.exception))
            self.assertNotEqual(m.group(1, 2), m.group(3, 4))
        # Each setting that shapes the sequence is named.
        with Loader(DATA, order="random", seed=6, no_shuffle=True, drop_last_batch=True,
                    **dict(SMALL, batch_size=15)) as loader:
            self.assertEqual(len(loader), 13)  # as many batches as the saved 16's
            with self.assertRaises(ValueError) as cm:
                loader.load_state_dict(random_state)
            for line in ("seed: the state was saved with 5; this Loader has 6",
                         "no_shuffle: the state was saved with false; this Loader has true",
                         "drop_last_batch: the state was saved with false; this Loader has true",
                         "batch_size: the state was saved with 16; this Loader has 15"):
                self.assertIn(line, str(cm.exception))
            self.assertNotIn("order", str(cm.exception))

    def test_a_state_resumes_after_a_split_is_added_to_the_shard_set(self):
        # Issue 29 item 9: the state keyed on the whole manifest, so adding a
        # val split refused a train state ("saved on another data set").
        import shutil
        grown = os.path.join(WORK, "grown")
        shutil.copytree(DATA, grown)
        shutil.copytree(os.path.join(DATA, "test"), os.path.join(grown, "val"))
        with open(os.path.join(grown, "manifest.json")) as f:
            manifest = json.load(f)
        val = json.loads(json.dumps(manifest["splits"]["test"]))
        for shard in val["shards"]:
            shard["path"] = shard["path"].replace("test/", "val/")
        manifest["splits"]["val"] = val
        with open(os.path.join(grown, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        with Loader(DATA, seed=5, **SMALL) as loader:
            it = iter(loader)
            next(it)
            state = loader.state_dict()
            rest = [b.indices.tolist() for b in it]
        with Loader(grown, seed=5, **SMALL) as again:
            again.load_state_dict(state)
            self.assertEqual([b.indices.tolist() for b in again], rest)
        # Another split's samples are still refused.
        with Loader(grown, "val", seed=5, **SMALL) as other:
            with self.assertRaisesRegex(ValueError, "saved on another data set or split"):
                other.load_state_dict(state)
        # A state saved before (data: the manifest's SHA-256) loads on that manifest.
        import hashlib
        with open(os.path.join(DATA, "manifest.json"), "rb") as f:
            older = dict(state, data=hashlib.sha256(f.read()).hexdigest())
        with Loader(DATA, seed=5, **SMALL) as same:
            same.load_state_dict(older)

    def test_close_and_the_with_block_stop_the_server(self):
        loader = Loader(DATA, **SMALL)
        pid = loader._proc.pid
        next(iter(loader))
        loader.close()
        self.assertTrue(wait_gone(pid, 1), "close() waits for the server")
        loader.close()
        with self.assertRaisesRegex(LoaderError, "closed"):
            next(iter(loader))
        with Loader(DATA, **SMALL) as loader:
            pid = loader._proc.pid
        self.assertTrue(wait_gone(pid, 1))

    def test_a_forked_child_neither_uses_nor_stops_the_parents_server(self):
        with Loader(DATA, **SMALL) as loader:
            it = iter(loader)
            next(it)
            pid = os.fork()
            if pid == 0:  # the child: iterating raises, closing leaves the server alone
                code = 1
                try:
                    try:
                        next(iter(loader))
                    except LoaderError as e:
                        code = 0 if "a fork" in str(e) else 2
                    loader.close()
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)
            self.assertTrue(alive(loader._proc.pid), "the child stopped the parent's server")
            self.assertEqual(len(list(it)), 12, "the parent's epoch goes on")

    def test_one_iteration_at_a_time(self):
        with Loader(DATA, **SMALL) as loader:
            a, b = iter(loader), iter(loader)
            with self.assertRaisesRegex(LoaderError, "replaced by a later iter"):
                next(a)
            self.assertEqual([x.batch for x in b], list(range(13)), "b gives the epoch, once")
            with self.assertRaisesRegex(LoaderError, "replaced by a later iter"):
                list(zip(loader, loader))

    def test_a_loader_dropped_mid_iteration_in_a_reference_cycle_is_collected(self):
        import gc
        loader = Loader(DATA, **SMALL)
        loader.batches = iter(loader)
        next(loader.batches)
        pid = loader._proc.pid
        del loader
        gc.collect()
        self.assertTrue(wait_gone(pid, 10), "the server of a collected Loader still runs")

    def test_close_ends_a_stopped_server_within_seconds(self):
        loader = Loader(DATA, **SMALL)
        next(iter(loader))
        pid = loader._proc.pid
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        loader.close()
        self.assertLess(time.monotonic() - t0, 12)
        self.assertTrue(wait_gone(pid, 1))

    def test_the_data_path_may_be_bytes(self):
        with Loader(os.fsencode(DATA), **SMALL) as loader:
            self.assertEqual(loader.data, DATA)

    def test_the_server_goes_when_its_python_process_is_killed(self):
        for how in ("exit", "kill"):
            code = ("import os, sys, numa_loader\n"
                    "l = numa_loader.Loader(%r, batch_size=16, image_size=32, threads=1, "
                    "no_bind=True, quiet=True)\n"
                    "print(l._proc.pid, flush=True)\n"
                    "%s\n" % (DATA, "sys.exit(0)" if how == "exit" else
                              "os.kill(os.getpid(), 9)"))
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=PYDIR), timeout=120)
            self.assertTrue(p.stdout.strip(), p.stderr)
            pid = int(p.stdout.split()[0])
            self.assertTrue(wait_gone(pid), "server %d outlives its Python process (%s)" % (pid, how))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_SCRIPT = r"""
import json, os, sys, time
import torch, torch.distributed as dist
import numa_loader
kw = json.loads(sys.argv[1])
mode = kw.pop("mode", "after")
look = kw.pop("look", False)  # rank 0 first looks at the data with a one-rank Loader
second = kw.pop("second", None)  # then a second Loader, of this split, on every rank
second_ranks = kw.pop("second_ranks", None)  # (or only on these)
t0 = time.monotonic()
try:
    if mode == "tcp":  # a process group made with tcp://, no MASTER_* variables
        dist.init_process_group("gloo", init_method=kw.pop("init"), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    data = kw.pop("data")
    if look and os.environ["RANK"] == "0":
        with numa_loader.Loader(data, **dict(kw, rank=0, world_size=1)) as q:
            next(iter(q))
    l = numa_loader.Loader(data, **kw)
    out = {"job": l.job_id}
    if second and (second_ranks is None or int(os.environ["RANK"]) in second_ranks):
        with numa_loader.Loader(data, **dict(kw, split=second)) as l2:
            out.update(job2=l2.job_id, indices2=[b.indices.tolist() for b in l2])
    if mode == "then_pg":  # the process group made at once, the Loader alive
        dist.init_process_group("gloo")
    l.set_epoch(1)
    out.update(len=len(l), indices=[b.indices.tolist() for b in l])
    l.close()
    if mode == "after":  # the process group made after the Loader is gone
        dist.init_process_group("gloo")
    if mode != "none":
        t = torch.ones(1)
        dist.all_reduce(t)
        out["sum"] = t.item()
except numa_loader.LoaderError as e:
    out = {"error": str(e)}
out["seconds"] = time.monotonic() - t0
print(json.dumps(out))
"""


def run_ranks(per_rank, ranks=None, env_of=None):
    """Runs RANK_SCRIPT as each rank (or only `ranks` of them) with torchrun's
    variables (env_of(rank, env) may change them); their JSON lines."""
    port = str(free_port())
    procs = []
    for r, kw in enumerate(per_rank):
        if ranks is not None and r not in ranks:
            continue
        env = dict(os.environ, PYTHONPATH=PYDIR, RANK=str(r), WORLD_SIZE=str(len(per_rank)),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(len(per_rank)),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        if env_of is not None:
            env = env_of(r, env)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT,
                                       json.dumps(dict({"data": DATA}, **kw))], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert out.strip(), err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


class TwoRanksTest(unittest.TestCase):
    def test_ranks_share_the_epoch(self):
        kw = dict(SMALL, seed=4, timeout_s=60)
        a, b = run_ranks([kw, kw])
        self.assertEqual(a["len"], b["len"])
        self.assertEqual(a["len"], 7)  # 100 samples a rank, batches of 16
        self.assertEqual([a["sum"], b["sum"]], [2.0, 2.0])
        got = sorted(sum(a["indices"], []) + sum(b["indices"], []))
        self.assertEqual(got, list(range(200)), "the ranks' shares partition the split")
        self.assertEqual(a["job"], b["job"])

    def test_the_process_group_made_while_the_loader_lives_shares_its_store(self):
        for _ in range(3):
            a, b = run_ranks([dict(SMALL, mode="then_pg")] * 2)
            self.assertNotIn("error", a)
            self.assertEqual([a["sum"], b["sum"]], [2.0, 2.0])

    def test_ranks_of_a_tcp_process_group_agree_on_the_job_id(self):
        init = "tcp://127.0.0.1:%d" % free_port()

        def no_master(r, env):
            for v in ("MASTER_ADDR", "MASTER_PORT"):
                env.pop(v)
            return env
        a, b = run_ranks([dict(SMALL, mode="tcp", init=init, timeout_s=60)] * 2, env_of=no_master)
        self.assertNotIn("error", a)
        self.assertEqual(a["job"], b["job"])
        self.assertEqual(sorted(sum(a["indices"], []) + sum(b["indices"], [])), list(range(200)))

    def test_a_missing_rank_is_named_within_the_timeout(self):
        for present, want in ((1, "cannot reach the store at MASTER_ADDR:MASTER_PORT"),
                              (0, "missing: .*settings/1")):
            out, = run_ranks([dict(SMALL, timeout_s=4)] * 2, ranks=[present])
            self.assertRegex(out.get("error", ""), want)
            self.assertLess(out["seconds"], 20)

    def test_single_rank_processes_with_master_set_do_not_collide(self):
        procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT,
                                   json.dumps(dict(SMALL, data=DATA, mode="none"))],
                                  env=dict(os.environ, PYTHONPATH=PYDIR, MASTER_ADDR="127.0.0.1",
                                           MASTER_PORT="29999"),
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
        self.assertEqual([o.get("error") for o in outs], [None, None])
        self.assertNotEqual(outs[0]["job"], outs[1]["job"])

    def test_a_loader_of_rank_0_alone_leaves_the_job_id_and_two_loaders_each_have_one(self):
        # Issue 29 item 5: rank 0's one-rank Loader counted towards the job id,
        # so its training Loader waited under another id than rank 1's.
        outs = run_ranks([dict(SMALL, timeout_s=10, look=True, second="test")] * 2)
        for r, out in enumerate(outs):
            self.assertNotIn("error", out, "rank %d" % r)
        a, b = outs
        self.assertEqual(a["job"], b["job"])
        self.assertEqual(a["job2"], b["job2"])
        self.assertNotEqual(a["job"], a["job2"], "two Loaders in sequence, two ids")
        self.assertEqual(sorted(sum(a["indices"] + b["indices"], [])), list(range(200)))
        self.assertEqual(sorted(sum(a["indices2"] + b["indices2"], [])), list(range(10)))

    def test_a_loader_made_by_one_rank_only_is_named(self):
        t0 = time.monotonic()
        a, b = run_ranks([dict(SMALL, timeout_s=4, mode="none", second="test",
                               second_ranks=[0])] * 2)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertNotIn("error", b)
        self.assertIn("missing: settings/1", a.get("error", ""))
        # (Rank 1 ended without it: from rank 0 that looks as a rank still on its
        # way would, so both are said.)
        self.assertIn("rank 1 has made 1 Loader of this job's 2 ranks so far, and rank 0 2: it has not "
                      "made the one that pairs with this (it is still on its way, it stopped, or it "
                      "makes fewer Loaders)", a["error"])
        self.assertIn("make the same Loaders, in the same order, on every rank", a["error"])

    def test_blocks_of_another_size_are_named(self):
        # Each rank's io_memory sets its blocks, and the ranks' shares of the
        # epoch are cut from one sequence of blocks: they must agree. (A
        # split of 4,000: with 2,000 samples a rank, 64M gives blocks of 3,
        # 4M of 1.)
        data = data_4k()
        outs = run_ranks([dict(SMALL, order="blocks", io_memory=io, timeout_s=15, data=data)
                          for io in ("64M", "4M")])
        for out in outs:
            self.assertRegex(out.get("error", ""), r"block_samples: rank 0 has 3; rank 1 has 1(\n|$)")

    def test_windows_wider_than_the_share_are_one_sequence(self):
        # Blocks of one sample on both (200 samples): 64M and 4M would both
        # hold more than a rank's 100 samples, which is then one window:
        # the same sequence, so the ranks agree.
        kw = [dict(SMALL, order="blocks", io_memory=io, timeout_s=15) for io in ("64M", "4M")]
        outs = run_ranks(kw)
        for out in outs:
            self.assertNotIn("error", out)

    def test_a_split_mismatch_is_named_at_once(self):
        # Issue 29 item 4: the split fed the derived job id, so the ranks
        # published under different ids and each waited out timeout_s.
        outs = run_ranks([dict(SMALL, timeout_s=15), dict(SMALL, split="test", timeout_s=15)])
        for r, out in enumerate(outs):
            self.assertIn("split: rank 0 has train; rank 1 has test", out.get("error", ""),
                          "rank %d" % r)
            self.assertLess(out["seconds"], 10, "rank %d waited for the timeout" % r)

    def test_a_mismatch_raises_on_every_rank_naming_the_setting(self):
        t0 = time.monotonic()
        outs = run_ranks([dict(SMALL, timeout_s=60), dict(SMALL, batch_size=8, seed=1,
                                                          timeout_s=60)])
        self.assertLess(time.monotonic() - t0, 60)
        for r, out in enumerate(outs):
            self.assertIn("error", out, "rank %d went on" % r)
            self.assertIn("batch_size: rank 0 has 16; rank 1 has 8", out["error"])
            self.assertIn("seed: rank 0 has 0; rank 1 has 1", out["error"])
            self.assertIn("rank %d: the ranks' loaders do not agree" % r, out["error"])


TORCHRUN_SCRIPT = r"""
import json, os, signal, sys
import torch.distributed as dist
import numa_loader
data, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
kw = dict(batch_size=16, image_size=32, threads=1, no_bind=True, quiet=True)
with numa_loader.Loader(data, **kw) as l:
    with open(os.path.join(out, "job%d" % rank), "w") as f:
        f.write(l.job_id)
    res = {"job": l.job_id, "rank": l.rank, "world": l.world_size, "len": len(l), "epochs": []}
    for epoch in range(2):
        l.set_epoch(epoch)
        batches = []
        for b in l:
            batches.append(b.indices.tolist())
            if mode in ("raise", "kill") and len(batches) == 2:
                if mode == "raise":
                    raise RuntimeError("the training loop failed")
                if rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
        res["epochs"].append(batches)
if mode == "resume":  # epoch 1 again: 3 batches, a checkpoint, then a new Loader from it
    with numa_loader.Loader(data, **kw) as l:
        l.set_epoch(1)
        it = iter(l)
        first = [next(it).indices.tolist() for _ in range(3)]
        state = l.state_dict()
    with numa_loader.Loader(data, **kw) as l:
        l.load_state_dict(state)
        l.set_epoch(1)
        res["resumed"] = first + [b.indices.tolist() for b in l]
with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
"""


def servers_of(job):
    """pids of the processes whose command line names the job id."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if job.encode() in args and alive(int(d)):
            found.append(int(d))
    return found


@LIBTORCH_BOUND
class TorchrunTest(unittest.TestCase):
    def torchrun(self, mode):
        out = tempfile.mkdtemp(dir=WORK)
        script = os.path.join(out, "train.py")
        with open(script, "w") as f:
            f.write(TORCHRUN_SCRIPT)
        # Debian's torch 1.13 on Python 3.11: -r 2 -t 2 (see docs/guide/python.md).
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "-r", "2", "-t", "2",
                            "--log_dir", os.path.join(out, "logs"), "--nproc_per_node", "2",
                            "--master_port", str(free_port()), script, DATA, out, mode],
                           env=dict(os.environ, PYTHONPATH=PYDIR), capture_output=True, text=True,
                           timeout=300)
        jobs = set()
        for r in (0, 1):
            try:
                with open(os.path.join(out, "job%d" % r)) as f:
                    jobs.add(f.read())
            except OSError:
                pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(servers_of(j) for j in jobs):
            time.sleep(0.1)
        for j in jobs:
            self.assertEqual(servers_of(j), [], "servers of job %s left running (%s)" % (j, mode))
        return p, out, jobs

    def test_two_ranks_share_each_epoch_and_resume_as_a_straight_run(self):
        p, out, jobs = self.torchrun("resume")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(len(jobs), 1, "the ranks derive one job id")
        ranks = []
        for r in (0, 1):
            with open(os.path.join(out, "rank%d.json" % r)) as f:
                ranks.append(json.load(f))
        self.assertEqual([r["world"] for r in ranks], [2, 2])
        self.assertEqual([r["len"] for r in ranks], [7, 7])
        for e in range(2):
            got = sorted(sum(ranks[0]["epochs"][e], []) + sum(ranks[1]["epochs"][e], []))
            self.assertEqual(got, list(range(200)), "epoch %d: the shares partition the split" % e)
        self.assertNotEqual(ranks[0]["epochs"][0], ranks[0]["epochs"][1])
        for r in ranks:
            self.assertEqual(r["resumed"], r["epochs"][1], "the resumed epoch equals the straight one")

    def test_nothing_is_left_running_after_an_exception_in_the_loop(self):
        p, out, jobs = self.torchrun("raise")
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(len(jobs), 1)

    def test_nothing_is_left_running_after_kill_9_of_a_rank(self):
        p, out, jobs = self.torchrun("kill")
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(len(jobs), 1)


@LIBTORCH_BOUND
class GuideTest(unittest.TestCase):
    def test_the_python_guides_train_py_trains_two_epochs(self):
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONPATH=PYDIR, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        p = subprocess.run([sys.executable, os.path.join(here, "guide_loop_check.py"),
                            os.path.join(here, "..", "..", "..", "..", "docs", "guide", "python.md"),
                            "loader", DATA],
                           env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"guide train.py: 2 epochs of 4 batches")


def main():
    """Runs the part named by --part (torch: the LibTorch- and torchrun-bound
    classes; plain: the others; all by default), then any unittest arguments.
    A run with a skipped test and no failure exits 77, which ctest
    (SKIP_RETURN_CODE 77) reports as skipped, never as passed: the two parts
    are ctest tests of their own, so each is wholly run or wholly skipped."""
    args = sys.argv[4:]
    part = "all"
    if args[:1] == ["--part"] and len(args) > 1:
        part, args = args[1], args[2:]
    bound = {TorchrunTest, GuideTest}
    loader = unittest.TestLoader()
    if args:
        suite = loader.loadTestsFromNames(args, sys.modules[__name__])
    else:
        suite = unittest.TestSuite()
        for c in (v for v in globals().values() if isinstance(v, type) and issubclass(v, unittest.TestCase)):
            if part == "all" or (part == "torch") == (c in bound):
                suite.addTests(loader.loadTestsFromTestCase(c))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped:
        print("%d of %d tests skipped: %s" % (len(result.skipped), result.testsRun,
                                             "; ".join(sorted({why for _, why in result.skipped}))))
        sys.exit(77)
    if result.testsRun == 0:
        sys.exit("no test ran")


if __name__ == "__main__":
    main()
