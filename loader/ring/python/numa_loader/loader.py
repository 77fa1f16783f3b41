"""numa_loader.Loader: a DataLoader-shaped loader that starts and owns its rank's
`loader serve` (see Loader's docstring)."""

import atexit
import collections
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from . import Client, LoaderError, _Closes, _whole

__all__ = ["Loader", "LoaderBatch", "SERVE_OPTIONS", "SERVE_RANGES", "SERVE_CHOICES", "loader_path",
           "serve_options"]

# The options of `loader serve` a Loader passes on, as the loader binary
# defines them (`loader serve --options-json`, read once per binary): keyword
# name -> (kind, default), the range of each numeric option (an item's, for a
# list) and the choices of each option that takes one of a few words. The
# name is the flag's without "--", "-" as "_"; a default of None means the
# flag is not given and the loader picks. SERVE_OPTIONS, SERVE_RANGES and
# SERVE_CHOICES are those of the binary loader_path() finds.
_MANAGED = ("data", "job_id", "rank", "world_size", "local_rank", "local_world_size", "epochs",
            "start_epoch", "start_batch", "attach_timeout", "simulate_delay_ms")  # the Loader's own
_KINDS = ("flag", "int", "float", "str", "choice", "size", "ints", "floats")
_TABLES = {}  # the loader's path -> (options, ranges, choices)


def serve_options(loader=None):
    """(options, ranges, choices) of `loader serve` as `loader` (default:
    loader_path()) defines them: the keywords a Loader takes."""
    path = loader or loader_path()
    if path in _TABLES:
        return _TABLES[path]
    try:
        out = subprocess.run([path, "serve", "--options-json"], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LoaderError("cannot ask %s for its options (serve --options-json): %s"
                          % (path, getattr(e, "strerror", None) or e)) from None
    try:
        table = json.loads(out.stdout) if out.returncode == 0 else None
    except ValueError:
        table = None
    if not isinstance(table, list):
        raise LoaderError("%s serve --options-json did not print its options (exit %d): %s"
                          % (path, out.returncode, out.stderr.decode(errors="replace").strip()
                             or out.stdout[:200]))
    options, ranges, choices = collections.OrderedDict(), {}, {}
    for o in table:
        try:
            name, kind = o["field"], o["kind"]
            o["default"], (o["choices"] if kind == "choice" else None)
            (o["min"], o["max"]) if "min" in o else None
        except (KeyError, TypeError):
            raise LoaderError("%s serve --options-json: an entry is not an option "
                              "(field, kind, default; min and max; choices): %r"
                              % (path, o)) from None
        if kind not in _KINDS:
            raise LoaderError("%s serve --options-json: --%s is of a kind this package does not "
                              "know, %r (a newer loader than this package?)" % (path, name, kind))
        if name in _MANAGED:
            continue
        if kind == "choice":
            choices[name] = tuple(o["choices"])
            kind = "str"
        options[name] = (kind, o["default"])
        if "min" in o:
            ranges[name] = (o["min"], o["max"])
    _TABLES[path] = (options, ranges, choices)
    return _TABLES[path]


def __getattr__(name):
    tables = {"SERVE_OPTIONS": 0, "SERVE_RANGES": 1, "SERVE_CHOICES": 2}
    if name in tables:
        return serve_options()[tables[name]]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


# The server's ranges for the placement (--rank, --world-size, --local-rank,
# --local-world-size).
_MAX_WORLD = 2**20
_MAX_LOCAL_RANKS = 1024

# What every rank's server must agree on (the rest, threads, binding,
# read-ahead, is each rank's own; but the blocks an io_memory gives are not).
# (The window too: a state records this rank's, and the server caps it at a
# rank's share, so windows differ only where the ranks' memories do.)
_AGREED = ("data", "split", "batch_size", "seed", "world_size", "no_shuffle", "drop_last",
           "drop_last_batch", "on_bad_record", "order", "block_samples", "window_blocks",
           "image_size", "resize", "resize_size", "augment", "pad_crop", "random_resized_crop",
           "no_flip", "decode", "layout", "normalize", "mean", "std", "batches_per_epoch",
           "sample_bytes")

# What shapes an epoch's sequence of samples, which a state records and a
# resume must have: the order as the server resolved it (with blocks, their
# size and the window, which io_memory and the split's sizes set), then the
# sampler's settings.
_ORDER = ("order", "block_samples", "window_blocks")
_SEQUENCE = _ORDER + ("seed", "no_shuffle", "drop_last", "drop_last_batch", "batch_size",
                      "world_size")


def loader_path():
    """The `loader` executable: $NUMA_LOADER_BIN, else the one this package was
    built or installed with, else `loader` on PATH."""
    env = os.environ.get("NUMA_LOADER_BIN")
    if env:
        return env
    try:
        from . import _build
        path = getattr(_build, "LOADER", "")
    except ImportError:
        path = ""
    if path and os.path.isfile(path):
        return path
    found = shutil.which("loader")
    if found:
        return found
    raise LoaderError("cannot find the `loader` executable: set NUMA_LOADER_BIN to its path "
                      "(the package records the build's, %s, which is missing)" % (path or "none"))


_SIZE_UNITS = {"": 0, "B": 0, "K": 10, "KiB": 10, "M": 20, "MiB": 20, "G": 30, "GiB": 30,
               "T": 40, "TiB": 40}  # as the server's ParseByteSize


def _flag_value(name, kind, value, ranges, choices):
    """The command-line text of one option's value, checked against its kind,
    range and choices: a TypeError or ValueError naming the keyword for what
    the flag could not take."""
    lo, hi = ranges.get(name, (None, None))
    if kind == "flag":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError("%s must be True or False, not %r" % (name, value))
        return None
    if kind == "int":
        return str(_whole(name, value, hi, lo))
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("%s must be a number, not %r" % (name, value))
        if not lo <= value <= hi:  # (NaN too)
            raise ValueError("%s %r is outside %g .. %g" % (name, value, lo, hi))
        return repr(float(value))
    if kind == "size":
        if isinstance(value, str):
            m = re.fullmatch(r"([0-9]+)([A-Za-z]*)", value)
            if not m or m.group(2) not in _SIZE_UNITS:
                raise ValueError("%s must be a byte count (K, M, G, T suffixes), not %r"
                                 % (name, value))
            if int(m.group(1)) << _SIZE_UNITS[m.group(2)] > hi:
                raise ValueError("%s %r is outside %d .. %d bytes" % (name, value, lo, hi))
            return value
        return str(_whole(name, value, hi, lo))
    if kind in ("floats", "ints"):
        try:
            items = value.split(",") if isinstance(value, str) else list(value)
        except TypeError:
            raise TypeError("%s must be a list of numbers or a comma-separated string, not %r"
                            % (name, value)) from None
        if not items:
            raise ValueError("%s is empty" % name)
        out = []
        for v in items:
            try:
                if kind == "ints":
                    n = int(v) if isinstance(v, str) else v
                else:
                    f = float(v)
            except ValueError:
                raise ValueError("%s holds %r, not a %s" % (
                    name, v, "whole number" if kind == "ints" else "number")) from None
            if kind == "ints":
                out.append(str(_whole(name, n, hi, lo)))
                continue
            if f != f or f in (float("inf"), float("-inf")):
                raise ValueError("%s holds %r, not a finite number" % (name, v))
            if not lo <= f <= hi:
                raise ValueError("%s holds %r, outside %g .. %g" % (name, v, lo, hi))
            out.append(repr(f))
        return ",".join(out)
    if not isinstance(value, str):
        raise TypeError("%s must be a string, not %r" % (name, value))
    if "\0" in value:
        raise ValueError("%s holds a NUL character" % name)
    if name in choices and value not in choices[name]:
        raise ValueError("%s must be %s, not %r" % (
            name, " or ".join(", ".join(repr(c) for c in choices[name]).rsplit(", ", 1)), value))
    return value


def _serve_args(options, table):
    """`loader serve` arguments for the options that differ from the flag's default."""
    args = []
    serve, ranges, choices = table
    for name, (kind, default) in serve.items():
        value = options[name]
        if value is None or (kind == "flag" and value is False and default is False):
            continue
        text = _flag_value(name, kind, value, ranges, choices)
        args.append("--" + name.replace("_", "-"))
        if kind != "flag":
            args.append(text)
    return args


_MAX_SECONDS = 1e7  # as loader serve's own timeouts (and within what Python's waits take)


def _seconds(name, value):
    """A timeout: None (no limit) or a number of seconds, more than 0 and at
    most _MAX_SECONDS."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("%s must be a number of seconds or None, not %r" % (name, value))
    if not 0 < value <= _MAX_SECONDS:
        raise ValueError("%s must be more than 0 and finite, at most %g (None: no limit), not %r"
                         % (name, _MAX_SECONDS, value))
    return float(value)


def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise LoaderError("$%s is %r, not a whole number" % (name, v)) from None


def _placement(rank, world_size, local_rank, local_world_size):
    """(rank, world size, local rank, local world size): given ones, else the
    initialised process group's, else torchrun's variables, else one rank."""
    dist = _dist()
    if rank is None:
        rank = dist.get_rank() if dist else _env_int("RANK")
    if world_size is None:
        world_size = dist.get_world_size() if dist else _env_int("WORLD_SIZE")
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if local_rank is None:
        local_rank = _env_int("LOCAL_RANK")
    if local_world_size is None:
        local_world_size = _env_int("LOCAL_WORLD_SIZE")
    if local_rank is None:  # one node, as far as anything says
        local_rank, local_world_size = rank, local_world_size or world_size
    if local_world_size is None:
        local_world_size = world_size
    rank = _whole("rank", rank, _MAX_WORLD - 1)
    world_size = _whole("world_size", world_size, _MAX_WORLD, 1)
    local_rank = _whole("local_rank", local_rank, _MAX_LOCAL_RANKS - 1)
    local_world_size = _whole("local_world_size", local_world_size, _MAX_LOCAL_RANKS, 1)
    if rank >= world_size:
        raise ValueError("rank %d is not within a world of %d" % (rank, world_size))
    if local_rank >= local_world_size:
        raise ValueError("local rank %d is not within %d local ranks" % (local_rank, local_world_size))
    return rank, world_size, local_rank, local_world_size


def _dist():
    """torch.distributed when a process group is initialised, else None."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


_MADE = collections.Counter()  # world size -> Loaders of that world this process made
_STORES = {}  # (address, port) -> the store a Loader made there, kept for the process's life


def _derived_job_id(rank, world_size, store, deadline):
    """(job id, tally key, count): a job id every rank of this job shares (the
    ring's name adds the rank) and no other job on the node has: from
    torchrun's run id and restart count, or the master address and port; else
    rank 0's, through the store; a process on its own adds its pid. Only what
    every rank has in common goes in (a setting that differs, the split, then
    gives the same id, and the settings' comparison names it): the world size,
    and the count of this process's Loaders of that world size, so each rank's
    n-th Loader of the job pairs with the others' n-th, and a one-rank Loader
    (rank 0 looking at the data) shifts nothing. The count is also added up in
    the store under the tally key + rank (None without a store), to say so
    when the ranks made different numbers of Loaders."""
    seq = _MADE[world_size]
    _MADE[world_size] += 1
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    where = "%s:%s" % (os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""))
    named = bool(run) or where != ":"
    common = "|".join([run, os.environ.get("TORCHELASTIC_RESTART_COUNT", ""), where,
                       "" if named and world_size > 1 else str(os.getpid()), str(world_size)])
    mine = "nl-%s-%d" % (_digest("%s|%d" % (common, seq)), seq)
    tally = None
    if store is not None:
        tally = "numa_loader/%s/loaders/" % _digest(common)
        store.add(tally + str(rank), 1)
    if world_size == 1 or named or store is None:
        return mine, tally, seq
    key = "numa_loader/job-id/%d" % seq  # (a process group made without MASTER_*: tcp://, file://)
    if rank == 0:
        _publish(store, key, mine)
        return mine, tally, seq
    _store_wait(store, [key], deadline, rank, "rank 0's job id")
    return store.get(key).decode(), tally, seq


def _digest(text):
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _publish(store, key, value):
    """store[key] = value, and its counter key + "/n" raised to 1 (a store's add
    answers at once whether a key is there; its wait, once timed out, leaves the
    connection unusable, and a PrefixStore has no check)."""
    store.set(key, value)
    store.add(key + "/n", 1)


def _store_wait(store, keys, deadline, rank, what):
    """Waits until every key is published, or the deadline (None: no limit)
    passes: then a LoaderError naming the keys still missing."""
    t0 = time.monotonic()
    pause = 0.005
    pending = list(keys)
    while pending:
        pending = [k for k in pending if store.add(k + "/n", 0) < 1]
        if not pending:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise LoaderError("rank %d: %s did not come within %.0f s (missing: %s)"
                              % (rank, what, time.monotonic() - t0, ", ".join(pending)))
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _settings_store(rank, world_size, deadline):
    """A store every rank shares, for agreeing on the job id and comparing
    settings: the process group's, or one at MASTER_ADDR:MASTER_PORT (torchrun's
    agent's, or rank 0's, which init_process_group later shares); None with one
    rank or without either (the check is then skipped, and says why)."""
    if world_size == 1:
        return None, "one rank"
    dist = _dist()
    if dist is not None:
        return dist.distributed_c10d._get_default_store(), ""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None, "no process group is initialised and MASTER_ADDR/MASTER_PORT are not set"
    if (addr, port) in _STORES:
        return _STORES[(addr, port)], ""
    import datetime
    import torch.distributed as tdist
    left = 10 * 365 * 86400 if deadline is None else max(0.001, deadline - time.monotonic())
    try:
        store, _, _ = next(tdist.rendezvous("env://", rank, world_size,
                                            timeout=datetime.timedelta(seconds=left)))
    except (RuntimeError, ValueError, OSError) as e:  # (torch raises the builtin TimeoutError)
        raise LoaderError("rank %d: cannot reach the store at MASTER_ADDR:MASTER_PORT (%s:%s, rank "
                          "0's or torchrun's) within %.0f s: %s" % (rank, addr, port, left, e)) \
            from None
    # Kept: on rank 0 it serves the others, and init_process_group's own store
    # at the same port is this one (TCPStore's multi-tenant server).
    _STORES[(addr, port)] = store
    return store, ""


def _data_ids(data, split):
    """(the split's id, the manifest's SHA-256). The split's id is what its
    samples are: the SHA-256 of the manifest's classes and the split's entry
    (its shards with their counts and checksums, encoding, shape, sizes),
    less where it was packed from and what the pack left out (source,
    skipped), as canonical JSON; another split added to the shard set leaves
    it as it was. (A manifest or split the server cannot read gets the
    manifest's hash: the server then refuses it, with its words.)"""
    path = os.path.join(data, "manifest.json")
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise LoaderError("cannot read %s: %s" % (path, e.strerror or e)) from None
    whole = hashlib.sha256(text).hexdigest()
    try:
        manifest = json.loads(text)
        entry = {k: v for k, v in manifest["splits"][split].items()
                 if k not in ("source", "skipped")}
        what = json.dumps({"classes": manifest["classes"], "split": entry}, sort_keys=True,
                          separators=(",", ":"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return whole, whole
    return hashlib.sha256(what.encode("utf-8")).hexdigest(), whole


def _shown(value):
    """A setting's value in a message: text as it is (train, not "train")."""
    return value if isinstance(value, str) else json.dumps(value)


def _compare(mine, everyone):
    """The settings that differ between ranks, as lines naming each rank's value."""
    lines = []
    for key in _AGREED:
        values = [s.get(key) for s in everyone]
        if all(v == values[0] for v in values):
            continue
        groups = collections.OrderedDict()  # the value's JSON -> the ranks that have it
        for r, v in enumerate(values):
            groups.setdefault(json.dumps(v, sort_keys=True), []).append(r)
        lines.append("%s: %s" % (key, "; ".join(
            "rank%s %s has %s" % ("s" if len(rs) > 1 else "", ",".join(map(str, rs)),
                                  _shown(json.loads(v)))
            for v, rs in groups.items())))
    return lines


class _BlockPool:
    """Memory for the batches a Loader hands out, used again once the caller is
    done with it. Fresh memory costs a page fault per 4 KiB (a float32 batch of
    64 at 224 px is 38.5 MB: ~50 ms here, against ~5 ms for the copy itself).
    A block goes back to the pool when the numpy array handed out over it dies,
    and that array lives as long as any tensor made from it or a view of such a
    tensor (torch.from_numpy's storage holds it). At most `keep` free blocks are
    kept; the rest are freed."""

    def __init__(self, keep):
        self._free = {}
        self._keep = keep
        self._lock = threading.Lock()

    def array(self, shape, dtype):
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            blocks = self._free.get(key)
            block = blocks.pop() if blocks else None
        if block is None:
            block = np.empty(shape, dtype)
        view = block.view()
        weakref.finalize(view, self._give_back, key, block)
        return view

    def _give_back(self, key, block):
        with self._lock:
            blocks = self._free.setdefault(key, [])
            if len(blocks) < self._keep:
                blocks.append(block)


def _copy_batch(pool, pin_memory, got):
    """A batch copied out of its slot into the caller's tensors; the slot released."""
    import torch
    pixels, labels, indices = got.pixels, got.labels, got.indices
    dtype = torch.uint8 if pixels.dtype == np.uint8 else torch.float32
    if pin_memory and torch.cuda.is_available():
        # (torch's pinned allocator keeps and reuses its blocks itself)
        x = torch.empty(pixels.shape, dtype=dtype, pin_memory=True)
        y = torch.empty(labels.shape, dtype=torch.int64, pin_memory=True)
        np.copyto(x.numpy(), pixels)
        np.copyto(y.numpy(), labels)
    else:
        xa = pool.array(pixels.shape, pixels.dtype)
        np.copyto(xa, pixels)
        x = torch.from_numpy(xa)
        y = torch.from_numpy(np.array(labels))
    idx = torch.from_numpy(np.array(indices))
    item = LoaderBatch(x, y, idx, got.epoch, got.batch, got.wait_s)
    got.release()
    return item


def _ending(rc):
    """How a process with return code rc ended, in words."""
    if rc is None:
        return "nothing yet"
    return "signal %d" % -rc if rc < 0 else "status %d" % rc


def _server_state(proc, log):
    """The server's state, for error messages: running, or how it exited and its last lines."""
    if proc is None:
        return "stopped"
    if proc.poll() is None:
        return "running, pid %d" % proc.pid
    state = "exited with " + _ending(proc.returncode)
    tail = log.tail(4) if log is not None else ""
    return state + (":\n" + tail if tail else "")


class _Stopped(Exception):
    """The copier was stopped (close(), a new iter(), the end of the loop)."""


class _Copier:
    """An iteration's thread: takes the epoch's batches from the client and copies
    each into the caller's tensors, one or two batches ahead of the training
    loop, so the copy (numpy's releases the GIL) overlaps the step. While it
    runs, no other thread uses the client. It holds no reference to the Loader
    (a Loader dropped mid-iteration is collected, and stops it)."""

    _AHEAD = 2

    def __init__(self, client, copy, describe, rank, epoch, start, n):
        import queue
        self._client, self._copy, self._describe = client, copy, describe
        self._rank, self._epoch, self._start, self._n = rank, epoch, start, n
        self._queue = queue.Queue(self._AHEAD)
        self._stop = threading.Event()
        self.stream_next = None  # the stream's position after the last batch taken
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="numa_loader copier (rank %d)" % rank)
        self._thread.start()

    def _run(self):
        epoch, n = self._epoch, self._n
        try:
            for b in range(self._start, n):
                try:
                    got = self._client._next_batch(self._stop.is_set)
                except StopIteration:
                    raise LoaderError("loader serve for rank %d ended its stream at epoch %d "
                                      "batch %d (%s)" % (self._rank, epoch, b,
                                                         self._describe())) from None
                except LoaderError as e:
                    if self._stop.is_set():
                        return
                    raise LoaderError("%s\n(loader serve: %s)" % (e, self._describe())) from None
                if got is None:
                    return
                self.stream_next = (got.epoch, got.batch + 1) if got.batch + 1 < n \
                    else (got.epoch + 1, 0)
                if (got.epoch, got.batch) != (epoch, b):
                    raise LoaderError("rank %d expected epoch %d batch %d and got epoch %d batch "
                                      "%d from its server" % (self._rank, epoch, b, got.epoch,
                                                               got.batch))
                if not self._put(self._copy(got)):
                    return
        except BaseException as e:  # noqa: BLE001 - carried to the training loop's thread
            self._put(e)

    def _put(self, item):
        import queue
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_SLICE_S)
                return True
            except queue.Full:
                continue
        return False

    def get(self):
        """The next batch (raising what the thread raised; _Stopped once stopped)."""
        import queue
        while True:
            if self._stop.is_set():
                raise _Stopped()
            try:
                item = self._queue.get(timeout=_SLICE_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise _Stopped() from None
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self):
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


_SLICE_S = 0.25  # the longest a wait blocks without looking at a stop flag


class LoaderBatch(tuple):
    """One batch as (x, y), unpacking like a DataLoader's, with .x, .y, .indices
    (int64 tensor: the samples' global indices), .epoch, .batch (within its
    epoch) and .wait_s (seconds waited for the server)."""

    def __new__(cls, x, y, indices, epoch, batch, wait_s):
        self = super().__new__(cls, (x, y))
        self.indices, self.epoch, self.batch, self.wait_s = indices, epoch, batch, wait_s
        return self

    x = property(lambda self: self[0])
    y = property(lambda self: self[1])

    def __repr__(self):
        return "LoaderBatch(epoch=%d, batch=%d, size=%d)" % (self.epoch, self.batch, len(self[1]))


def _read_plan(line):
    """The order a server's read-plan line gives, "...: order blocks (--order
    blocks); blocks of 4064 samples (15.9 MiB), 512 a window; ...", as
    {"order", "block_samples", "window_blocks"} (None for random's blocks);
    None for another line."""
    m = re.search(r": order (random|blocks) \(", line)
    if not m:
        return None
    blocks = re.search(r"; blocks of (\d+) samples \([^)]*\), (\d+) a window", line)
    return {"order": m.group(1),
            "block_samples": int(blocks.group(1)) if blocks else None,
            "window_blocks": int(blocks.group(2)) if blocks else None}


def _order_text(settings):
    """random, or blocks (blocks of 4064 samples, 512 a window)."""
    if settings.get("order") != "blocks":
        return str(settings.get("order"))
    return "blocks (blocks of %s samples, %s a window)" % (settings.get("block_samples"),
                                                          settings.get("window_blocks"))


class _ServerLog:
    """Reads the server's stderr on a thread: echoes each line to ours (unless
    quiet) and keeps the last lines for error messages."""

    def __init__(self, stream, quiet):
        self.lines = collections.deque(maxlen=40)
        self.order = None
        self._cv = threading.Condition()
        self._closed = False
        self._quiet = quiet
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True,
                                        name="numa_loader server log")
        self._thread.start()

    def _run(self, stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cv:
                self.lines.append(line)
                if self.order is None:
                    self.order = _read_plan(line)
                self._cv.notify_all()
            if not self._quiet:
                try:
                    sys.stderr.write(line + "\n")
                except Exception:  # noqa: BLE001 - stderr gone at exit: nothing to tell
                    pass
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        stream.close()

    def wait_order(self, timeout_s):
        """The server's order, as _read_plan gives it; None if its line did not
        come within timeout_s (or the server's stderr closed first)."""
        with self._cv:
            self._cv.wait_for(lambda: self.order is not None or self._closed, timeout_s)
            return self.order

    def tail(self, n=8):
        with self._cv:
            return "\n".join(list(self.lines)[-n:])

    def join(self, timeout_s):
        self._thread.join(timeout_s)


_LIVE = weakref.WeakSet()  # Loaders whose servers run: closed at exit


@atexit.register
def _close_all():
    for loader in list(_LIVE):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - at exit, nothing to report to
            pass


def _child_setup(parent):
    """In the server, before exec: SIGTERM when this (the Loader's) process dies,
    even by SIGKILL; if it is already gone, exit."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - without it the server still ends with its consumer
        pass
    if os.getppid() != parent:
        os._exit(1)


class Loader(_Closes):
    """The PyTorch user's entry point: one rank's batches as torch tensors.

        loader = numa_loader.Loader("~/data/c100", split="train", batch_size=64,
                                    image_size=224, augment=True)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for x, y in loader: ...

    It starts this rank's `loader serve` (bound to the cores of its GPU's NUMA
    node by the job's plan), attaches to its ring, and stops it on close(), on
    leaving a `with` block, at exit, and when this process dies. The rank and
    world come from the arguments, else the initialised process group, else
    torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, else one rank.

    Every keyword of SERVE_OPTIONS is the `loader serve` flag of that name
    (underscores for dashes), with the default the loader binary gives it
    (`loader serve --options-json`: batch_size, image_size, augment, order,
    io_memory, decode, normalize, mean, drop_last (DistributedSampler's: pad
    or trim the split across ranks), drop_last_batch (DataLoader's
    drop_last), ...); split too, when not given.

    Each iter() is one epoch of len(loader) batches: the epoch set_epoch()
    set (like DistributedSampler, iterating again without it repeats the same
    epoch). Items are LoaderBatch: (x, y) with x uint8 [B, 3, H, W] (NHWC
    with layout="nhwc"; float32 with normalize=True) and y int64 [B], and
    .indices, .epoch, .batch. x and y are the caller's own tensors (copied
    out of the ring, pinned with pin_memory=True): keep them, change them in
    place, nothing reaches the ring. state_dict()/load_state_dict() resume
    mid-epoch: the next iter() starts at the saved batch (a state whose
    sequence of samples differs, its order, blocks, seed, ..., is refused).

    Before the first batch the ranks compare their settings (data set,
    split, batch size, seed, world size, transform, order and its blocks)
    through the process group's store, or one at MASTER_ADDR:MASTER_PORT; a mismatch
    raises LoaderError on every rank, naming each setting and each rank's
    value.

    job_id: the servers' job id (default: derived from torchrun's run id, or
    the master address and port, and the count of this process's Loaders of
    the same world size: every rank makes the same Loaders in the same
    order; a world_size=1 Loader counts apart). timeout_s: the longest
    wait for one batch, and for the other ranks' settings. start_timeout_s:
    the longest wait for the server to start. quiet: keep the server's
    lines (its plan, its order) off stderr; errors still carry them.
    """

    def __init__(self, data, split=None, *, rank=None, world_size=None, local_rank=None,
                 local_world_size=None, job_id=None, pin_memory=False, timeout_s=60.0,
                 start_timeout_s=120.0, quiet=False, **options):
        self._proc = None
        self._client = None
        self._log = None
        self._pid = os.getpid()
        table = serve_options()
        unknown = sorted(set(options) - set(table[0]))
        if unknown:
            raise TypeError("Loader got unknown keyword argument%s %s (the loader serve "
                            "options are: %s)" % ("s" if len(unknown) > 1 else "",
                                                  ", ".join(unknown), ", ".join(table[0])))
        opts = {k: d for k, (_, d) in table[0].items()}
        opts.update(options)
        if split is not None:
            opts["split"] = split
        if not isinstance(data, (str, bytes, os.PathLike)):
            raise TypeError("data must be a path, not %r" % (data,))
        self.data = os.path.abspath(os.path.expanduser(os.fsdecode(data)))
        if "\0" in self.data:
            raise ValueError("data %r holds a NUL character" % self.data)
        args = _serve_args(opts, table)  # checks every value
        self.options = opts
        self.rank, self.world_size, self.local_rank, self.local_world_size = _placement(
            rank, world_size, local_rank, local_world_size)
        if job_id is not None and "\0" in str(job_id):
            raise ValueError("job id %r holds a NUL character" % str(job_id))
        self.timeout_s = _seconds("timeout_s", timeout_s)
        start_timeout_s = _seconds("start_timeout_s", start_timeout_s)
        self.pin_memory = bool(pin_memory)
        self.quiet = bool(quiet)
        self._pool = _BlockPool(keep=4)
        self._epoch = 0
        self._resume = None  # (epoch, batch) load_state_dict() set: where that epoch's next iter() starts
        self._state = (0, 0)  # what state_dict() says: the epoch iterated last, its next batch
        self._next = None  # (epoch, batch) the server's stream gives next
        self._iterated = set()  # epochs iterated to the end (to warn of a missing set_epoch)
        data_id, self._manifest_sha = _data_ids(self.data, opts["split"])
        # The ranks agree on the job id and compare their settings within timeout_s.
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        self._store, why = _settings_store(self.rank, self.world_size, deadline)
        self._tally = None  # (the store's key of each rank's count of Loaders, this one's count)
        if job_id is not None:
            self.job_id = str(job_id)
        else:
            self.job_id, tally, seq = _derived_job_id(self.rank, self.world_size, self._store,
                                                      deadline)
            self._tally = (tally, seq + 1)
        try:
            self._start(args, start_timeout_s)
            self._next = (0, 0)  # the server starts there
            info = self._client.info
            wait = 30 if self.timeout_s is None else self.timeout_s
            order = self._log.wait_order(wait)
            if order is None:  # (compared and recorded: never as an unknown)
                raise LoaderError("loader serve for rank %d did not say its read plan (the order it "
                                  "reads in) within %.0f s:\n%s" % (self.rank, wait, self._log.tail()))
            self._settings = dict(
                {k: opts[k] for k in _AGREED if k in opts},
                data=data_id, world_size=self.world_size, batches_per_epoch=info.batches_per_epoch,
                sample_bytes=info.sample_bytes, **order)
            if self._store is None:
                if self.world_size > 1:
                    warnings.warn("numa_loader.Loader: the ranks' settings were not compared: "
                                  + why)
            else:
                deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
                self._check_settings(deadline)
        except BaseException:
            self.close()
            raise

    # -- the server ---------------------------------------------------------

    def _start(self, args, start_timeout_s):
        cmd = [loader_path(), "serve", "--data", self.data, "--job-id", self.job_id,
               "--rank", str(self.rank), "--world-size", str(self.world_size),
               "--local-rank", str(self.local_rank),
               "--local-world-size", str(self.local_world_size)] + args
        if start_timeout_s is not None:  # (it ends if no consumer comes: no PDEATHSIG off the main thread)
            cmd += ["--attach-timeout", repr(max(start_timeout_s, 1.0))]
        main = threading.current_thread() is threading.main_thread()
        parent = os.getpid()
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=(lambda: _child_setup(parent)) if main else None, close_fds=True)
        except OSError as e:
            raise LoaderError("cannot start %s: %s" % (cmd[0], e.strerror or e)) from None
        _LIVE.add(self)
        self._log = _ServerLog(self._proc.stderr, self.quiet)
        deadline = None if start_timeout_s is None else time.monotonic() + start_timeout_s
        while True:
            if self._proc.poll() is not None:
                self._log.join(5)
                raise LoaderError("loader serve for rank %d exited with %s before it served:\n%s"
                                  % (self.rank, _ending(self._proc.returncode), self._log.tail()))
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise LoaderError("loader serve for rank %d (pid %d) did not start serving within "
                                  "%.0f s:\n%s" % (self.rank, self._proc.pid, start_timeout_s,
                                                   self._log.tail()))
            try:
                self._client = Client(self.job_id, self.rank, timeout_s=self.timeout_s,
                                      attach_timeout_s=min(0.5, left))
                return
            except LoaderError:
                continue

    def _check_settings(self, deadline):
        import torch.distributed as tdist
        prefix = tdist.PrefixStore("numa_loader/%s" % self.job_id, self._store)
        _publish(prefix, "settings/%d" % self.rank, json.dumps(self._settings, sort_keys=True))
        keys = ["settings/%d" % r for r in range(self.world_size)]
        try:
            _store_wait(prefix, keys, deadline, self.rank, "every rank's Loader settings")
        except LoaderError as e:
            raise LoaderError(str(e) + self._other_counts(prefix)) from None
        everyone = [json.loads(prefix.get(k)) for k in keys]
        # Read by all before any goes on: rank 0 may host the store, and a rank
        # that raises may end its process.
        _publish(prefix, "read/%d" % self.rank, "1")
        try:
            _store_wait(prefix, ["read/%d" % r for r in range(self.world_size)], deadline,
                        self.rank, "every rank's reading of the settings")
        except LoaderError:
            pass  # the others had what they needed, or have their own error
        diff = _compare(self._settings, everyone)
        if diff:
            raise LoaderError("rank %d: the ranks' loaders do not agree:\n  %s"
                              % (self.rank, "\n  ".join(diff)))

    def _other_counts(self, prefix):
        """For a rank whose settings never came: that it made another number of
        Loaders of this world than this rank (their ids then pair differently)."""
        key, mine = self._tally if self._tally is not None else (None, 0)
        if key is None:
            return ""
        lines, behind = [], []
        for r in range(self.world_size):
            if r == self.rank or prefix.add("settings/%d/n" % r, 0) > 0:
                continue
            theirs = self._store.add(key + str(r), 0)
            if theirs > mine:  # it went past this one: its n-th is another Loader
                lines.append("\nrank %d has made %d Loader%s of this job's %d ranks, and rank %d "
                             "%d" % (r, theirs, "" if theirs == 1 else "s", self.world_size,
                                     self.rank, mine))
            elif 0 < theirs < mine:  # on its way, stopped, or making fewer: not known which
                behind.append("\nrank %d has made %d Loader%s of this job's %d ranks so far, and rank "
                              "%d %d: it has not made the one that pairs with this (it is still on its "
                              "way, it stopped, or it makes fewer Loaders)"
                              % (r, theirs, "" if theirs == 1 else "s", self.world_size, self.rank,
                                 mine))
        if lines or behind:
            behind.append("\nthe derived job id pairs each rank's n-th Loader with the others' "
                          "n-th: make the same Loaders, in the same order, on every rank (a "
                          "Loader of one rank's own: world_size=1), or give each a job_id=")
        return "".join(lines + behind)

    # -- the DataLoader's shape ---------------------------------------------

    def __len__(self):
        """Batches per epoch for this rank (every rank has as many)."""
        return self._settings["batches_per_epoch"]

    @property
    def batch_size(self):
        return self.options["batch_size"]

    @property
    def epoch(self):
        return self._epoch

    def set_epoch(self, epoch):
        """The epoch the next iter() gives (its shuffle and augmentation), from its start."""
        self._epoch = _whole("epoch", epoch, 2**32)
        self._epoch_set = True

    def __iter__(self):
        self._check_open()
        epoch, start, n = self._epoch, 0, len(self)
        if self._resume is not None and self._resume[0] == epoch:
            start = self._resume[1]
        self._resume = None
        self._state = (epoch, start)
        self._generation += 1
        repeat = start == 0 and epoch in self._iterated and not self._epoch_set
        self._epoch_set = False
        if repeat and self._warn_repeat:
            self._warn_repeat = False
            warnings.warn("numa_loader.Loader: epoch %d is iterated again: call "
                          "loader.set_epoch(epoch) before each epoch for a new shuffle" % epoch,
                          stacklevel=2)
        return self._epoch_batches(epoch, start, n, self._generation)

    _warn_repeat = True  # once a Loader
    _epoch_set = False  # set_epoch() was called since the last iter()

    _generation = 0  # iter() calls: an older iterator stops working

    def _epoch_batches(self, epoch, start, n, generation):
        self._check_current(generation, epoch)
        self._stop_copier()  # an earlier iteration's
        if start < n and self._next != (epoch, start):
            self._client.seek(epoch, start)
            self._next = (epoch, start)
        if start >= n:
            return
        copier = self._copier = _Copier(
            self._client, functools.partial(_copy_batch, self._pool, self.pin_memory),
            functools.partial(_server_state, self._proc, self._log), self.rank, epoch, start, n)
        try:
            for b in range(start, n):
                self._check_current(generation, epoch)
                try:
                    item = copier.get()
                except _Stopped:
                    self._check_current(generation, epoch)  # says who stopped it
                    raise LoaderError("this iteration of the Loader was stopped") from None
                self._state = (epoch, b + 1)  # a state_dict() taken now resumes after this batch
                if b + 1 == n:
                    self._iterated.add(epoch)
                yield item
        finally:
            if self._copier is copier:
                self._stop_copier()

    def _check_current(self, generation, epoch):
        self._check_open()
        if generation != self._generation:
            raise LoaderError("this iterator of the Loader (epoch %d) was replaced by a later "
                              "iter(); one iteration at a time" % epoch)

    def _stop_copier(self):
        """Stops the iteration's copier thread; the stream's position is then
        what it took last (the batches it copied ahead are dropped)."""
        copier, self._copier = self._copier, None
        if copier is not None:
            copier.stop()
            if copier.stream_next is not None:
                self._next = copier.stream_next

    _copier = None
    _getpid = staticmethod(os.getpid)  # (module globals may be gone when a finalizer runs at exit)

    def state_dict(self):
        """Where iteration stands: {"epoch", "batch", "batches_per_epoch", "data", ...}:
        the epoch iterated last and the batch it gives next (batches_per_epoch once it
        is done); data names the split's samples (see _data_ids); and what shapes the
        epoch's sequence of samples: "order" as the server resolved it ("random" or
        "blocks", with "block_samples" and "window_blocks"), "seed", "no_shuffle",
        "drop_last", "drop_last_batch", "batch_size", "world_size". load_state_dict()
        with it makes that epoch's next iter() go on from there."""
        state = {"epoch": self._state[0], "batch": self._state[1],
                 "batches_per_epoch": len(self), "data": self._settings["data"]}
        state.update((k, self._settings[k]) for k in _SEQUENCE)
        return state

    def load_state_dict(self, state):
        """The next iter() of the saved epoch gives the rest of it (set_epoch() of that
        epoch keeps this; the epoch is set to it). A state of another split's samples,
        or whose sequence of samples differs from this Loader's (its order, blocks, seed,
        ...; see state_dict), is refused with a ValueError naming each difference (a
        state saved before these were recorded is checked for what it has, and
        refused in blocks order, whose blocks were sized otherwise then)."""
        if not isinstance(state, dict):
            raise TypeError("load_state_dict takes the dict state_dict() returns, not %r"
                            % type(state).__name__)
        missing = [k for k in ("epoch", "batch") if k not in state]
        if missing:
            raise ValueError("the state has no %s" % " or ".join(missing))
        # (A state from before data named the split's samples has the manifest's hash.)
        if state.get("data", self._settings["data"]) not in (self._settings["data"],
                                                             self._manifest_sha):
            raise ValueError("the state was saved on another data set or split (its samples "
                             "%s; this Loader's split %r of %s: %s)"
                             % (str(state["data"])[:12], self.options["split"], self.data,
                                self._settings["data"][:12]))
        changed = self._sequence_changes(state)
        if changed:
            raise ValueError("the state was saved with another sequence of samples:\n  "
                             + "\n  ".join(changed))
        saved_n = _whole("the state's batches_per_epoch", state.get("batches_per_epoch", len(self)),
                         2**63)
        if saved_n != len(self):
            raise ValueError("the state was saved with %s batches an epoch, this loader has %d "
                             "(batch size, world size or split differ)"
                             % (saved_n, len(self)))
        epoch = _whole("the state's epoch", state["epoch"], 2**32)
        batch = _whole("the state's batch", state["batch"], len(self))
        self._epoch = epoch
        self._resume = self._state = (epoch, batch)

    def _sequence_changes(self, state):
        """What of the sequence of samples the state was saved with differs from this
        Loader's, one line a setting (the order with its blocks as one)."""
        mine = self._settings
        lines = []
        if "order" in state and any(state.get(k) != mine[k] for k in _ORDER):
            lines.append("order: the state was saved with %s; this Loader reads %s"
                         % (_order_text(state), _order_text(mine)))
        elif "order" not in state and mine["order"] != "random":
            # A state of an earlier numa_loader: random order's sequence is as
            # it was, but blocks were sized otherwise then.
            lines.append("order: the state does not say its order (saved by an earlier numa_loader, "
                         "which sized blocks otherwise); this Loader reads %s: resume it with "
                         "order=\"random\" if it was saved so, else start the epoch again"
                         % _order_text(mine))
        for k in _SEQUENCE:
            if k not in _ORDER and k in state and state[k] != mine[k]:
                lines.append("%s: the state was saved with %s; this Loader has %s"
                             % (k, _shown(state[k]), _shown(mine[k])))
        return lines

    # -- lifetime -------------------------------------------------------------

    def close(self):
        """Stops the server (it exits once told goodbye; after 5 s it is
        terminated, and killed 5 s later). Closing twice is a no-op."""
        _LIVE.discard(self)
        if self._pid != self._getpid():  # a forked child: the server is the parent's
            self._client = self._proc = self._copier = None
            return
        self._stop_copier()
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the server is stopped below either way
                pass
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(5 if client is not None else 0.01)  # it exits once told goodbye
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped server cannot act on SIGTERM
                    proc.wait(5)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait()
        if self._log is not None:
            self._log.join(5)

    @property
    def closed(self):
        return self._client is None

    def _check_open(self):
        if self._client is None:
            raise LoaderError("this Loader (job %s, rank %d) is closed" % (self.job_id, self.rank))
        if self._pid != self._getpid():
            raise LoaderError("this Loader was made in process %d, and this is process %d (a "
                              "fork): make a Loader of its own here" % (self._pid, os.getpid()))

    def _server_state(self):
        return _server_state(self._proc, self._log)

    def __repr__(self):
        return "Loader(%r, split=%r, rank=%d of %d, batch_size=%d%s)" % (
            self.data, self.options["split"], self.rank, self.world_size, self.batch_size,
            ", closed" if self.closed else "")
