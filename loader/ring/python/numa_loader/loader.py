"""numa_loader.Loader: a DataLoader-shaped loader that starts and owns its rank's
`loader serve` (see Loader's docstring)."""

import atexit
import collections
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

from . import Client, LoaderError, _whole

__all__ = ["Loader", "LoaderBatch", "SERVE_OPTIONS", "loader_path"]

# The options of `loader serve` a Loader passes on: keyword name -> (kind,
# default). The name is the flag's without "--", "-" as "_"; the default is
# the flag's (None: the flag is not given, and the loader picks). A test
# holds this table to `loader serve --help`.
SERVE_OPTIONS = collections.OrderedDict([
    ("split", ("str", "train")),
    ("batch_size", ("int", 64)),
    ("prefetch", ("int", 4)),
    ("seed", ("int", 0)),
    ("no_shuffle", ("flag", False)),
    ("drop_last", ("flag", False)),
    ("drop_last_batch", ("flag", False)),
    ("on_bad_record", ("str", "error")),
    ("order", ("str", "auto")),
    ("io_memory", ("size", None)),
    ("image_size", ("int", 224)),
    ("resize", ("str", "squash")),
    ("augment", ("flag", False)),
    ("pad_crop", ("int", None)),
    ("random_resized_crop", ("flag", False)),
    ("no_flip", ("flag", False)),
    ("decode", ("str", "auto")),
    ("layout", ("str", "nchw")),
    ("normalize", ("flag", False)),
    ("mean", ("floats", None)),
    ("std", ("floats", None)),
    ("threads", ("int", None)),
    ("stall_warning", ("float", 60.0)),
    ("gpus", ("ints", None)),
    ("numa_node", ("ints", None)),
    ("cpu_affinity", ("str", None)),
    ("trainer_cores", ("int", 1)),
    ("allow_shared_cores", ("flag", False)),
    ("ignore_gpus", ("flag", False)),
    ("no_bind", ("flag", False)),
])

# What every rank's server must agree on (the rest, threads, binding,
# read-ahead, is each rank's own).
_AGREED = ("data", "split", "batch_size", "seed", "world_size", "no_shuffle", "drop_last",
           "drop_last_batch", "on_bad_record", "order", "image_size", "resize", "augment",
           "pad_crop", "random_resized_crop", "no_flip", "decode", "layout", "normalize", "mean",
           "std", "batches_per_epoch", "sample_bytes")

_INT_MAX = 2**31 - 1


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


def _flag_value(name, kind, value):
    """The command-line text of one option's value, checked: a TypeError or
    ValueError naming the keyword for what the flag could not take."""
    if kind == "flag":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError("%s must be True or False, not %r" % (name, value))
        return None
    if kind == "int":
        return str(_whole(name, value, 2**40))
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("%s must be a number, not %r" % (name, value))
        if not 0 <= value < float("inf"):
            raise ValueError("%s must be 0 or more, not %r" % (name, value))
        return repr(float(value))
    if kind == "size":
        if isinstance(value, str):
            if not re.fullmatch(r"[0-9]+[KMG]?", value):
                raise ValueError("%s must be a byte count (K, M, G suffixes), not %r" % (name, value))
            return value
        return str(_whole(name, value, 2**62))
    if kind in ("floats", "ints"):
        items = value.split(",") if isinstance(value, str) else list(value)
        out = []
        for v in items:
            if kind == "ints":
                out.append(str(_whole(name, int(v) if isinstance(v, str) else v, _INT_MAX)))
            else:
                f = float(v)
                if f != f or f in (float("inf"), float("-inf")):
                    raise ValueError("%s holds %r, not a finite number" % (name, v))
                out.append(repr(f))
        return ",".join(out)
    if not isinstance(value, str):
        raise TypeError("%s must be a string, not %r" % (name, value))
    if "\0" in value:
        raise ValueError("%s holds a NUL character" % name)
    return value


def _serve_args(options):
    """`loader serve` arguments for the options that differ from the flag's default."""
    args = []
    for name, (kind, default) in SERVE_OPTIONS.items():
        value = options[name]
        if value is None or (kind == "flag" and value is False and default is False):
            continue
        text = _flag_value(name, kind, value)
        args.append("--" + name.replace("_", "-"))
        if kind != "flag":
            args.append(text)
    return args


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
    rank = _whole("rank", rank, _INT_MAX)
    world_size = _whole("world_size", world_size, _INT_MAX)
    local_rank = _whole("local_rank", local_rank, _INT_MAX)
    local_world_size = _whole("local_world_size", local_world_size, _INT_MAX)
    if world_size < 1 or rank >= world_size:
        raise ValueError("rank %d is not within a world of %d" % (rank, world_size))
    if local_world_size < 1 or local_rank >= local_world_size:
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


_SEQUENCE = [0]  # Loaders made by this process: part of the derived job id


def _derived_job_id(split):
    """A job id this process's ranks do not share with another job on the node:
    from torchrun's run id and restart count, or the master address and port,
    and this process's id and its count of Loaders."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    where = "%s:%s" % (os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""))
    # Every rank of a job derives the same id (the ring's name adds the rank);
    # a process on its own adds its pid.
    alone = not run and where == ":"
    base = "|".join([run, os.environ.get("TORCHELASTIC_RESTART_COUNT", ""), where,
                     str(os.getpid()) if alone else "", str(_SEQUENCE[0]), split])
    _SEQUENCE[0] += 1
    return "nl-%s-%d" % (hashlib.sha256(base.encode("utf-8", "surrogateescape")).hexdigest()[:16],
                         _SEQUENCE[0] - 1)


def _settings_store(rank, world_size, timeout_s):
    """A store every rank shares, for comparing settings: the process group's, or
    one at torchrun's MASTER_ADDR:MASTER_PORT (as init_process_group would make
    it); None with one rank or without either (the check is then skipped)."""
    if world_size == 1:
        return None, "one rank"
    dist = _dist()
    if dist is not None:
        return dist.distributed_c10d._get_default_store(), ""
    if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        return None, "no process group is initialised and MASTER_ADDR/MASTER_PORT are not set"
    import datetime
    import torch.distributed as tdist
    store, _, _ = next(tdist.rendezvous("env://", rank, world_size,
                                        timeout=datetime.timedelta(seconds=timeout_s)))
    return store, ""


def _manifest_id(data):
    path = os.path.join(data, "manifest.json")
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise LoaderError("cannot read %s: %s" % (path, e.strerror or e)) from None


def _compare(mine, everyone):
    """The settings that differ between ranks, as lines naming each rank's value."""
    lines = []
    for key in _AGREED:
        values = [s.get(key) for s in everyone]
        if all(v == values[0] for v in values):
            continue
        groups = collections.OrderedDict()
        for r, v in enumerate(values):
            groups.setdefault(json.dumps(v), []).append(r)
        lines.append("%s: %s" % (key, "; ".join(
            "rank%s %s has %s" % ("s" if len(rs) > 1 else "", ",".join(map(str, rs)), v)
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


class _Copier:
    """An iteration's thread: takes the epoch's batches from the client and copies
    each into the caller's tensors, one or two batches ahead of the training
    loop, so the copy (numpy's releases the GIL) overlaps the step. While it
    runs, no other thread uses the client."""

    _AHEAD = 2

    def __init__(self, loader, epoch, start, n):
        import queue
        self._loader, self._epoch, self._start, self._n = loader, epoch, start, n
        self._queue = queue.Queue(self._AHEAD)
        self._stop = threading.Event()
        self.stream_next = None  # the stream's position after the last batch taken
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="numa_loader copier (rank %d)" % loader.rank)
        self._thread.start()

    def _run(self):
        loader, epoch, n = self._loader, self._epoch, self._n
        try:
            for b in range(self._start, n):
                try:
                    got = loader._client._next_batch(self._stop.is_set)
                except StopIteration:
                    raise LoaderError("loader serve for rank %d ended its stream at epoch %d "
                                      "batch %d (%s)" % (loader.rank, epoch, b,
                                                         loader._server_state())) from None
                except LoaderError as e:
                    raise LoaderError("%s\n(loader serve: %s)" % (e, loader._server_state())) \
                        from None
                if got is None:
                    return
                self.stream_next = (got.epoch, got.batch + 1) if got.batch + 1 < n \
                    else (got.epoch + 1, 0)
                if (got.epoch, got.batch) != (epoch, b):
                    raise LoaderError("rank %d expected epoch %d batch %d and got epoch %d batch "
                                      "%d from its server" % (loader.rank, epoch, b, got.epoch,
                                                               got.batch))
                if not self._put(loader._copy(got)):
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
        """The next batch (raising what the thread raised)."""
        import queue
        while True:
            try:
                item = self._queue.get(timeout=_SLICE_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise LoaderError("the Loader's copier thread ended without a batch") from None
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
            m = re.search(r": order (random|blocks) \(", line)
            with self._cv:
                self.lines.append(line)
                if m and self.order is None:
                    self.order = m.group(1)
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


class Loader:
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
    (underscores for dashes), with its default: batch_size=64, image_size=224,
    augment=False, order="auto", io_memory=None (the loader's), decode="auto",
    normalize=False, mean=..., drop_last (DistributedSampler's: pad or trim
    the split across ranks), drop_last_batch (DataLoader's drop_last), ...

    Each iter() is one epoch of len(loader) batches: the epoch set_epoch()
    set (like DistributedSampler, iterating again without it repeats the same
    epoch). Items are LoaderBatch: (x, y) with x uint8 [B, 3, H, W] (NHWC
    with layout="nhwc"; float32 with normalize=True) and y int64 [B], and
    .indices, .epoch, .batch. x and y are the caller's own tensors (copied
    out of the ring, pinned with pin_memory=True): keep them, change them in
    place, nothing reaches the ring. state_dict()/load_state_dict() resume
    mid-epoch: the next iter() starts at the saved batch.

    Before the first batch the ranks compare their settings (data set,
    split, batch size, seed, world size, transform, order) through the
    process group's store, or one at MASTER_ADDR:MASTER_PORT; a mismatch
    raises LoaderError on every rank, naming each setting and each rank's
    value.

    job_id: the servers' job id (default: derived from torchrun's run id, or
    the master address and port, and this process). timeout_s: the longest
    wait for one batch, and for the other ranks' settings. start_timeout_s:
    the longest wait for the server to start. quiet: keep the server's
    lines (its plan, its order) off stderr; errors still carry them.
    """

    def __init__(self, data, split="train", *, rank=None, world_size=None, local_rank=None,
                 local_world_size=None, job_id=None, pin_memory=False, timeout_s=60.0,
                 start_timeout_s=120.0, quiet=False, **options):
        self._proc = None
        self._client = None
        self._log = None
        self._pid = os.getpid()
        unknown = sorted(set(options) - set(SERVE_OPTIONS))
        if unknown:
            raise TypeError("Loader got unknown keyword argument%s %s (the loader serve "
                            "options are: %s)" % ("s" if len(unknown) > 1 else "",
                                                  ", ".join(unknown), ", ".join(SERVE_OPTIONS)))
        opts = {k: d for k, (_, d) in SERVE_OPTIONS.items()}
        opts.update(options, split=split)
        if not isinstance(data, (str, os.PathLike)):
            raise TypeError("data must be a path, not %r" % (data,))
        self.data = os.path.abspath(os.path.expanduser(os.fspath(data)))
        args = _serve_args(opts)  # checks every value
        self.options = opts
        self.rank, self.world_size, self.local_rank, self.local_world_size = _placement(
            rank, world_size, local_rank, local_world_size)
        self.job_id = _derived_job_id(split) if job_id is None else str(job_id)
        if "\0" in self.job_id:
            raise ValueError("job id %r holds a NUL character" % self.job_id)
        self.timeout_s = float(timeout_s)
        self.pin_memory = bool(pin_memory)
        self.quiet = bool(quiet)
        self._pool = _BlockPool(keep=4)
        self._epoch = 0
        self._resume = None  # (epoch, batch) load_state_dict() set: where that epoch's next iter() starts
        self._state = (0, 0)  # what state_dict() says: the epoch iterated last, its next batch
        self._next = None  # (epoch, batch) the server's stream gives next
        self._iterated = set()  # epochs iterated to the end (to warn of a missing set_epoch)
        data_id = _manifest_id(self.data)
        self._start(args, float(start_timeout_s))
        self._next = (0, 0)  # the server starts there
        try:
            info = self._client.info
            self._settings = dict(
                {k: opts[k] for k in _AGREED if k in opts},
                data=data_id, world_size=self.world_size, batches_per_epoch=info.batches_per_epoch,
                sample_bytes=info.sample_bytes, order=self._log.wait_order(self.timeout_s))
            self._check_settings()
        except BaseException:
            self.close()
            raise

    # -- the server ---------------------------------------------------------

    def _start(self, args, start_timeout_s):
        cmd = [loader_path(), "serve", "--data", self.data, "--job-id", self.job_id,
               "--rank", str(self.rank), "--world-size", str(self.world_size),
               "--local-rank", str(self.local_rank),
               "--local-world-size", str(self.local_world_size)] + args
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
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self._proc.poll() is not None:
                self._log.join(5)
                raise LoaderError("loader serve for rank %d exited with %s before it served:\n%s"
                                  % (self.rank, self._exit_text(), self._log.tail()))
            left = deadline - time.monotonic()
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

    def _exit_text(self):
        rc = self._proc.returncode
        if rc is None:
            return "nothing yet"
        return "signal %d" % -rc if rc < 0 else "status %d" % rc

    def _check_settings(self):
        store, why = _settings_store(self.rank, self.world_size, self.timeout_s)
        if store is None:
            if self.world_size > 1:
                warnings.warn("numa_loader.Loader: the ranks' settings were not compared: " + why)
            return
        import datetime
        import torch.distributed as tdist
        prefix = tdist.PrefixStore("numa_loader/%s" % self.job_id, store)
        prefix.set("settings/%d" % self.rank, json.dumps(self._settings, sort_keys=True))
        keys = ["settings/%d" % r for r in range(self.world_size)]
        try:
            prefix.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise LoaderError("rank %d: not every rank's Loader published its settings within "
                              "%.0f s (%s)" % (self.rank, self.timeout_s, e)) from None
        everyone = [json.loads(prefix.get(k)) for k in keys]
        diff = _compare(self._settings, everyone)
        if diff:
            raise LoaderError("rank %d: the ranks' loaders do not agree:\n  %s"
                              % (self.rank, "\n  ".join(diff)))

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
        return self._epoch_batches(epoch, start, n)

    _warn_repeat = True  # once a Loader
    _epoch_set = False  # set_epoch() was called since the last iter()

    _generation = 0  # iter() calls: an older iterator stops working

    def _epoch_batches(self, epoch, start, n):
        generation = self._generation
        self._stop_copier()  # an earlier iteration's
        if start < n and self._next != (epoch, start):
            self._client.seek(epoch, start)
            self._next = (epoch, start)
        if start >= n:
            return
        copier = self._copier = _Copier(self, epoch, start, n)
        try:
            for b in range(start, n):
                self._check_open()
                if generation != self._generation:
                    raise LoaderError("this iterator of the Loader (epoch %d) was replaced by a "
                                      "later iter(); one iteration at a time" % epoch)
                item = copier.get()
                self._state = (epoch, b + 1)  # a state_dict() taken now resumes after this batch
                if b + 1 == n:
                    self._iterated.add(epoch)
                yield item
        finally:
            if self._copier is copier:
                self._stop_copier()

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

    def _copy(self, got):
        import torch
        pixels, labels, indices = got.pixels, got.labels, got.indices
        dtype = torch.uint8 if pixels.dtype == np.uint8 else torch.float32
        if self.pin_memory and torch.cuda.is_available():
            # (torch's pinned allocator keeps and reuses its blocks itself)
            x = torch.empty(pixels.shape, dtype=dtype, pin_memory=True)
            y = torch.empty(labels.shape, dtype=torch.int64, pin_memory=True)
            np.copyto(x.numpy(), pixels)
            np.copyto(y.numpy(), labels)
        else:
            xa = self._pool.array(pixels.shape, pixels.dtype)
            np.copyto(xa, pixels)
            x = torch.from_numpy(xa)
            y = torch.from_numpy(np.array(labels))
        idx = torch.from_numpy(np.array(indices))
        item = LoaderBatch(x, y, idx, got.epoch, got.batch, got.wait_s)
        got.release()
        return item

    def state_dict(self):
        """Where iteration stands: {"epoch", "batch", "batches_per_epoch", "data"}: the
        epoch iterated last and the batch it gives next (batches_per_epoch once it is
        done). load_state_dict() with it makes that epoch's next iter() go on from there."""
        return {"epoch": self._state[0], "batch": self._state[1],
                "batches_per_epoch": len(self), "data": self._settings["data"]}

    def load_state_dict(self, state):
        """The next iter() of the saved epoch gives the rest of it (set_epoch() of that
        epoch keeps this; the epoch is set to it)."""
        if not isinstance(state, dict):
            raise TypeError("load_state_dict takes the dict state_dict() returns, not %r"
                            % type(state).__name__)
        missing = [k for k in ("epoch", "batch") if k not in state]
        if missing:
            raise ValueError("the state has no %s" % " or ".join(missing))
        if state.get("data", self._settings["data"]) != self._settings["data"]:
            raise ValueError("the state was saved on another data set (manifest %s, this one %s)"
                             % (str(state["data"])[:12], self._settings["data"][:12]))
        if state.get("batches_per_epoch", len(self)) != len(self):
            raise ValueError("the state was saved with %s batches an epoch, this loader has %d "
                             "(batch size, world size or split differ)"
                             % (state["batches_per_epoch"], len(self)))
        epoch = _whole("the state's epoch", state["epoch"], 2**32)
        batch = _whole("the state's batch", state["batch"], len(self))
        self._epoch = epoch
        self._resume = self._state = (epoch, batch)

    # -- lifetime -------------------------------------------------------------

    def close(self):
        """Stops the server (it exits once told goodbye; after 10 s it is
        terminated). Closing twice is a no-op."""
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
                proc.wait(10 if client is not None else 0.01)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
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
        if self._proc is None:
            return "stopped"
        rc = self._proc.poll()
        state = "running, pid %d" % self._proc.pid if rc is None else "exited with " + self._exit_text()
        tail = self._log.tail(4)
        return state + (":\n" + tail if tail and rc is not None else "")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to in a finalizer
            pass

    def __repr__(self):
        return "Loader(%r, split=%r, rank=%d of %d, batch_size=%d%s)" % (
            self.data, self.options["split"], self.rank, self.world_size, self.batch_size,
            ", closed" if self.closed else "")
