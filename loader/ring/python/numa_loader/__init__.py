"""numa_loader: take batches from a `loader serve` process, as numpy arrays.

A `loader serve --job-id J --rank R ...` process fills a shared-memory ring
with whole batches; `Client(J, R)` attaches to it through libnl_client.so
(ctypes; standard library and numpy only) and yields them in order:

    with numa_loader.Client("job1", rank) as client:
        for batch in client:
            x = torch.from_numpy(batch.pixels)   # views the ring slot: no copy
            y = torch.from_numpy(batch.labels)
            ...

Each batch has `.pixels` (uint8, or float32 with `loader serve --normalize`;
[B, C, H, W] for NCHW, [B, H, W, C] for NHWC, C = 3), `.labels` and
`.indices` (int64 [B]), `.epoch`, `.batch` (within its epoch), `.sequence`
(0, 1, ... over this client's batches), `.size` (B; an epoch's last batch
may be short) and `.wait_s` (seconds the client waited for the producer to
publish it: the loader's share of a step's data time).

Lifetime rule: a batch's arrays stay valid until the iterator is asked for the
next batch (it releases the previous one then) or batch.release()/client.close().
For a GPU copy that may still be running: batch.release_after(event) where
event is anything with .synchronize() (e.g.
torch.cuda.current_stream().record_event()): the client then calls
event.synchronize() before releasing that slot (when the next batch is asked
for), so x = torch.from_numpy(b.pixels).cuda(non_blocking=True) is safe.

After release the producer refills the slot, so `batch.pixels` (and `.labels`,
`.indices`) raise LoaderError; arrays taken from a batch before its release
still view the slot and read whatever the producer writes there next (another
batch): copy what you keep past the release (np.array(x), tensor.clone(), or
the GPU copy). Reading them never crashes: the ring stays mapped while any
array or tensor views it, whatever order the client, its batches and their
arrays are dropped in (close() tells the producer goodbye at once; the
mapping goes with the last view).

The arrays are read-only (numpy's writeable flag is off): the slot is shared
with the producer. torch.from_numpy accepts them and warns once per process
that the array is not writable; copy (or move to the GPU) before changing
data in place.

Errors raise LoaderError (a RuntimeError) with the library's text, which names
the job, rank and producer pid and carries the producer's own error (a bad
record, an unreadable shard); a producer that is alive but sent nothing
within the timeout raises LoaderTimeout (a LoaderError). The producer's end
(`loader serve --epochs N`) ends iteration.

The library: the build writes _build.py beside this file with the path of the
libnl_client.so it built; the environment variable NUMA_LOADER_LIB overrides
it. One Client is used by one thread at a time.
"""

import ctypes
import operator
import os
import threading
import time

import numpy as np

__all__ = ["Client", "Batch", "Info", "LoaderError", "LoaderTimeout", "library_path"]

# Return codes and enums of nl_client.h.
NL_OK, NL_END, NL_TIMEOUT, NL_ERROR = 0, 1, 2, 3
NL_DTYPE_UINT8, NL_DTYPE_FLOAT32 = 0, 1
NL_LAYOUT_NCHW, NL_LAYOUT_NHWC = 0, 1

_DTYPES = {NL_DTYPE_UINT8: np.dtype(np.uint8), NL_DTYPE_FLOAT32: np.dtype(np.float32)}
_LAYOUTS = {NL_LAYOUT_NCHW: "NCHW", NL_LAYOUT_NHWC: "NHWC"}


class LoaderError(RuntimeError):
    """The loader service or its client library failed; str() says why."""


class LoaderTimeout(LoaderError):
    """The producer is alive but sent nothing within the timeout."""


class _NlInfo(ctypes.Structure):
    """struct nl_info, field for field."""

    _fields_ = [
        ("slot_count", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("channels", ctypes.c_uint32),
        ("height", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("layout", ctypes.c_uint32),
        ("rank", ctypes.c_int32),
        ("producer_pid", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
        ("sample_bytes", ctypes.c_uint64),
        ("batches_per_epoch", ctypes.c_uint64),
        ("epochs", ctypes.c_uint64),
    ]


class _NlBatch(ctypes.Structure):
    """struct nl_batch, field for field."""

    _fields_ = [
        ("pixels", ctypes.c_void_p),
        ("labels", ctypes.POINTER(ctypes.c_int64)),
        ("indices", ctypes.POINTER(ctypes.c_int64)),
        ("size", ctypes.c_uint32),
        ("slot", ctypes.c_uint32),
        ("epoch", ctypes.c_uint64),
        ("batch", ctypes.c_uint64),
        ("sequence", ctypes.c_uint64),
        ("position", ctypes.c_uint64),
        ("wait_s", ctypes.c_double),
    ]


def _address(ptr):
    """The address a ctypes pointer holds (0 for NULL)."""
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def library_path():
    """The libnl_client.so this package uses: $NUMA_LOADER_LIB, else the build's."""
    env = os.environ.get("NUMA_LOADER_LIB")
    if env:
        return env
    try:
        from . import _build
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        raise LoaderError(
            "cannot find libnl_client.so: NUMA_LOADER_LIB is not set and %s/_build.py is "
            "missing (use the package the build lays out, PYTHONPATH=<build>/python, or set "
            "NUMA_LOADER_LIB to the library's path)" % here) from None
    return _build.LIBRARY


_lib = None
_lib_lock = threading.Lock()


def _load():
    """Loads the library once and declares each function's signature."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not os.path.isfile(path):
            raise LoaderError("cannot find libnl_client.so at %s (%s)" % (
                path, "from NUMA_LOADER_LIB" if os.environ.get("NUMA_LOADER_LIB")
                else "the path the build recorded in _build.py; rebuild, or set NUMA_LOADER_LIB"))
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise LoaderError("cannot load %s: %s" % (path, e)) from None
        handle = ctypes.c_void_p
        sigs = {
            "nl_attach": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_double,
                                         ctypes.POINTER(handle)]),
            "nl_attach_error": (ctypes.c_char_p, []),
            "nl_info_get": (ctypes.c_int, [handle, ctypes.POINTER(_NlInfo)]),
            "nl_next": (ctypes.c_int, [handle, ctypes.c_double, ctypes.POINTER(_NlBatch)]),
            "nl_release": (ctypes.c_int, [handle, ctypes.POINTER(_NlBatch)]),
            "nl_seek": (ctypes.c_int, [handle, ctypes.c_uint64, ctypes.c_uint64]),
            "nl_last_error": (ctypes.c_char_p, [handle]),
            "nl_goodbye": (None, [handle]),
            "nl_detach": (None, [handle]),
        }
        for name, (restype, argtypes) in sigs.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise LoaderError("%s does not export %s: not the client library this package "
                                  "was written for" % (path, name)) from None
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = lib
        return lib


# The longest one C call may block. Python runs signal handlers only between
# calls, so waits for a batch are made of slices this long (the library counts
# "sent nothing for N s" from the producer's last batch, so the report stays
# true) and Ctrl-C is answered promptly.
_WAIT_SLICE_S = 0.25


def _wait(call, timeout_s, stop=None):
    """call(t) repeated with t <= _WAIT_SLICE_S while it returns NL_TIMEOUT, until
    timeout_s has passed (timeout_s < 0: as long as it takes) or stop() says so.
    Returns the last code and the seconds spent in calls that timed out."""
    deadline = None if timeout_s < 0 else time.monotonic() + timeout_s
    waited = 0.0
    while True:
        t = _WAIT_SLICE_S
        if deadline is not None:
            t = min(t, max(0.0, deadline - time.monotonic()))
        t0 = time.monotonic()
        rc = call(t)
        if rc != NL_TIMEOUT or (deadline is not None and time.monotonic() >= deadline):
            return rc, waited
        if stop is not None and stop():
            return rc, waited
        waited += time.monotonic() - t0


def _attach(lib, job, rank, timeout_s):
    """nl_attach in a helper thread, so the caller's thread stays free for Ctrl-C
    (nl_attach's wait for the producer cannot be cut into slices: it reports the
    producer's absence as an error, not as a timeout). Returns (code, handle, text)."""
    state = {"done": False, "abandoned": False}
    lock = threading.Lock()

    def run():
        handle = ctypes.c_void_p()
        try:
            rc = lib.nl_attach(job, rank, timeout_s, ctypes.byref(handle))
            text = _text(lib.nl_attach_error()) if rc != NL_OK else ""  # per thread: read it here
        except Exception as e:  # noqa: BLE001 - carried to the caller's thread
            rc, text = NL_ERROR, "nl_attach: %s" % e
        with lock:
            if state["abandoned"]:
                if handle.value:
                    lib.nl_detach(handle)
                return
            state.update(done=True, rc=rc, handle=handle, text=text)

    t = threading.Thread(target=run, name="numa_loader attach", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(_WAIT_SLICE_S)
    except BaseException:  # KeyboardInterrupt: the thread detaches whatever it gets
        with lock:
            state["abandoned"] = True
            if state["done"] and state["handle"].value:
                lib.nl_detach(state["handle"])
        raise
    return state["rc"], state["handle"], state["text"]


def _text(raw):
    return raw.decode("utf-8", "replace") if raw else "(no error text)"


class Info:
    """The ring's geometry and the producer's identity (from nl_info)."""

    __slots__ = ("slot_count", "batch_size", "channels", "height", "width", "dtype", "layout",
                 "rank", "producer_pid", "sample_bytes", "batches_per_epoch", "epochs")

    def __init__(self, raw):
        if raw.dtype not in _DTYPES:
            raise LoaderError("the ring's dtype code %d is unknown to this package" % raw.dtype)
        if raw.layout not in _LAYOUTS:
            raise LoaderError("the ring's layout code %d is unknown to this package" % raw.layout)
        self.slot_count = raw.slot_count
        self.batch_size = raw.batch_size
        self.channels = raw.channels
        self.height = raw.height
        self.width = raw.width
        self.dtype = _DTYPES[raw.dtype]
        self.layout = _LAYOUTS[raw.layout]
        self.rank = raw.rank
        self.producer_pid = raw.producer_pid
        self.sample_bytes = raw.sample_bytes
        self.batches_per_epoch = raw.batches_per_epoch
        self.epochs = raw.epochs  # 0: unbounded
        want = self.channels * self.height * self.width * self.dtype.itemsize
        if want != self.sample_bytes:
            raise LoaderError("the ring says %d bytes per sample but %dx%dx%d %s is %d" % (
                self.sample_bytes, self.channels, self.height, self.width, self.dtype.name, want))

    def sample_shape(self):
        if self.layout == "NCHW":
            return (self.channels, self.height, self.width)
        return (self.height, self.width, self.channels)

    def as_dict(self):
        d = {k: getattr(self, k) for k in self.__slots__}
        d["dtype"] = self.dtype.name
        return d

    def __repr__(self):
        return "Info(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items())


class _Ring:
    """A client's mapping of the ring: unmapped (nl_detach) when the client and
    every array viewing the ring are gone. Not in a forked child: the mapping
    and the connection are the parent's."""

    __slots__ = ("_lib", "_handle", "_pid")
    _getpid = staticmethod(os.getpid)  # (module globals may be gone when a finalizer runs at exit)

    def __init__(self, lib, handle):
        self._lib, self._handle, self._pid = lib, handle, os.getpid()

    def __del__(self):
        try:
            if self._handle is not None and self._getpid() == self._pid:
                self._lib.nl_detach(self._handle)
        except Exception:  # noqa: BLE001 - at interpreter exit, nothing to report to
            pass
        self._handle = None


def _view(addr, count, dtype, shape, ring):
    """A read-only numpy array over `count` items at `addr`, no copy; it keeps
    `ring` (its mapping) alive."""
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    if not addr:
        raise LoaderError("the client library returned a NULL pointer for %d bytes" % nbytes)
    buf = (ctypes.c_char * nbytes).from_address(addr)
    buf._ring = ring  # numpy's array keeps buf, buf keeps the mapping
    arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
    arr.flags.writeable = False
    return arr


class Batch:
    """One batch, viewing its ring slot until released (see the module's lifetime rule)."""

    __slots__ = ("epoch", "batch", "sequence", "size", "slot", "wait_s", "_raw", "_client",
                 "_event", "_arrays", "_released")

    def __init__(self, client, raw, wait_s):
        self._client = client
        self._raw = raw
        self.wait_s = wait_s  # seconds the client waited for the producer to publish it
        self.epoch = raw.epoch
        self.batch = raw.batch
        self.sequence = raw.sequence
        self.size = raw.size
        self.slot = raw.slot
        self._event = None
        self._arrays = None
        self._released = False

    @property
    def released(self):
        return self._released

    def _views(self):
        if self._released:
            raise LoaderError(
                "batch (epoch %d, batch %d) was released: its slot belongs to the producer again "
                "(take what you need before asking for the next batch, or copy it)"
                % (self.epoch, self.batch))
        if self._arrays is None:
            info, raw, b, ring = self._client.info, self._raw, self.size, self._client._ring
            i64 = np.dtype("<i8")
            self._arrays = (
                _view(raw.pixels or 0, b * info.sample_bytes // info.dtype.itemsize, info.dtype,
                      (b,) + info.sample_shape(), ring),
                _view(_address(raw.labels), b, i64, (b,), ring),
                _view(_address(raw.indices), b, i64, (b,), ring),
            )
        return self._arrays

    @property
    def pixels(self):
        """uint8 or float32, [B, C, H, W] (NCHW) or [B, H, W, C] (NHWC); read-only view."""
        return self._views()[0]

    @property
    def labels(self):
        """int64 [B]; read-only view."""
        return self._views()[1]

    @property
    def indices(self):
        """int64 [B]: the samples' global indices in the split; read-only view."""
        return self._views()[2]

    def release_after(self, event):
        """Release this slot only after event.synchronize() returns (called when the next
        batch is asked for, or at release()/close()). One event per batch; a later call
        replaces an earlier one."""
        if self._released:
            raise LoaderError("release_after on batch (epoch %d, batch %d), already released"
                              % (self.epoch, self.batch))
        if not callable(getattr(event, "synchronize", None)):
            raise TypeError("release_after needs an object with .synchronize(), got %r"
                            % type(event).__name__)
        self._event = event

    def release(self):
        """Give the slot back to the producer now (after the release_after event, if any).
        Releasing twice is a no-op."""
        if self._released:
            return
        if self._event is not None:
            self._event.synchronize()  # if it raises, the batch stays held with its event
            self._event = None
        self._client._release(self)

    def __repr__(self):
        return "Batch(epoch=%d, batch=%d, sequence=%d, size=%d%s)" % (
            self.epoch, self.batch, self.sequence, self.size,
            ", released" if self._released else "")


def _whole(name, value, hi, lo=0):
    """`value` as an int in lo .. hi: a TypeError for what is not a whole number
    (a float, a bool, a string), a ValueError outside the range (ctypes would
    cut 2**32 to 0 and 1.7 to 1 without a word)."""
    if isinstance(value, bool):
        raise TypeError("%s must be a whole number, not %r" % (name, value))
    try:
        v = operator.index(value)
    except TypeError:
        hint = " (a string: convert it with int())" if isinstance(value, str) else ""
        raise TypeError("%s must be a whole number, not %r%s" % (name, value, hint)) from None
    if not lo <= v <= hi:
        raise ValueError("%s %d is outside %d .. %d" % (name, v, lo, hi))
    return v


class _Closes:
    """close() on leaving a `with` block and when collected."""

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


class Client(_Closes):
    """The consumer of rank `rank` of job `job_id` (see the module docstring).

    timeout_s bounds the wait for each batch (counted from the producer's last
    batch) and, unless attach_timeout_s is given, the wait for the producer to
    appear; None (or a negative value) waits as long as the producer lives.
    """

    _getpid = staticmethod(os.getpid)  # (module globals may be gone when a finalizer runs at exit)

    def __init__(self, job_id, rank, timeout_s=60.0, attach_timeout_s=None):
        self._handle = None
        self._ring = None
        self._held = None
        self._lib = _load()
        self.job_id = str(job_id)
        if "\0" in self.job_id:
            raise ValueError("job id %r holds a NUL character" % self.job_id)
        self.rank = _whole("rank", rank, 2**31 - 1)
        # The process that attached: a forked child shares the parent's ring and
        # connection, and must neither take its batches nor say goodbye for it.
        self._pid = os.getpid()
        self.timeout_s = -1.0 if timeout_s is None else float(timeout_s)
        attach_s = self.timeout_s if attach_timeout_s is None else float(attach_timeout_s)
        rc, handle, text = _attach(self._lib, self.job_id.encode(), self.rank, attach_s)
        if rc != NL_OK or not handle.value:
            raise (LoaderTimeout if rc == NL_TIMEOUT else LoaderError)(text)
        self._handle = handle
        self._ring = _Ring(self._lib, handle)
        raw = _NlInfo()
        rc = self._lib.nl_info_get(self._handle, ctypes.byref(raw))
        if rc != NL_OK:
            err = LoaderError(self._last_error())
            self.close()
            raise err
        try:
            self.info = Info(raw)
        except LoaderError:
            self.close()
            raise

    # -- iteration -------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        """Releases the batch the iterator gave last, then returns the next one."""
        return self._next_batch(None)

    def _next_batch(self, stop):
        """__next__, or None when stop() turns true while it waits."""
        self._check_open()
        if self._held is not None:
            self._held.release()
        raw = _NlBatch()
        rc, waited = _wait(lambda t: self._lib.nl_next(self._handle, t, ctypes.byref(raw)),
                           self.timeout_s, stop)
        if rc == NL_TIMEOUT and stop is not None and stop():
            return None
        if rc == NL_OK:
            self._held = Batch(self, raw, waited + raw.wait_s)
            return self._held
        if rc == NL_END:
            raise StopIteration
        raise (LoaderTimeout if rc == NL_TIMEOUT else LoaderError)(self._last_error())

    # -- position --------------------------------------------------------

    def seek(self, epoch, batch=0):
        """The next batch is (epoch, batch); releases the held batch first."""
        self._check_open()
        epoch, batch = _whole("seek's epoch", epoch, 2**64 - 1), _whole("seek's batch", batch, 2**64 - 1)
        if self._held is not None:
            self._held.release()
        if self._lib.nl_seek(self._handle, epoch, batch) != NL_OK:
            raise LoaderError(self._last_error())

    def set_epoch(self, epoch):
        """Like DistributedSampler.set_epoch: the next batch is (epoch, 0)."""
        self.seek(epoch, 0)

    # -- lifetime --------------------------------------------------------

    def close(self):
        """Releases the held batch (after its event) and says goodbye to the producer (it exits
        cleanly). The ring is unmapped now, or when the last array viewing it is gone.
        Closing twice is a no-op."""
        if self._handle is None:
            return
        if self._getpid() != self._pid:  # a forked child: the connection is the parent's
            self._handle, self._held, self._ring = None, None, None
            return
        held, self._held = self._held, None
        try:
            if held is not None and held._event is not None:
                event, held._event = held._event, None
                event.synchronize()  # a copy still reading the slot ends before the unmap
        finally:
            if held is not None:
                held._released = True
                held._arrays = None
            handle, self._handle = self._handle, None
            ring, self._ring = self._ring, None  # unmapped now, or with the last array that views it
            # A client collected with its batch (a cycle) may find its ring's
            # finalizer already run: the handle is freed, and detaching said
            # goodbye.
            if ring is not None and ring._handle is not None:
                self._lib.nl_goodbye(handle)

    @property
    def closed(self):
        return self._handle is None

    # -- internals -------------------------------------------------------

    def _check_open(self):
        if self._handle is None:
            raise LoaderError("client of job %r rank %d is closed" % (self.job_id, self.rank))
        if self._getpid() != self._pid:
            raise LoaderError("client of job %r rank %d was attached in process %d, and this is "
                              "process %d (a fork): attach a Client of its own here"
                              % (self.job_id, self.rank, self._pid, os.getpid()))

    def _last_error(self):
        return _text(self._lib.nl_last_error(self._handle))

    def _release(self, batch):
        self._check_open()
        rc = self._lib.nl_release(self._handle, ctypes.byref(batch._raw))
        batch._released = True
        batch._arrays = None
        if self._held is batch:
            self._held = None
        if rc != NL_OK:
            raise LoaderError(self._last_error())

    def __repr__(self):
        return "Client(job_id=%r, rank=%d%s)" % (self.job_id, self.rank,
                                                 ", closed" if self.closed else "")


from .loader import Loader, LoaderBatch, loader_path  # noqa: E402 - it builds on the above

__all__ += ["Loader", "LoaderBatch", "loader_path"]
