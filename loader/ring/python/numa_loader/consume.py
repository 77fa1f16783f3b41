"""python3 -m numa_loader.consume: the Python twin of `loader consume`.

    python3 -m numa_loader.consume --job-id ID [--rank R] [--batches N] [--timeout S]
        [--attach-timeout S] [--start-epoch E [--start-batch B]] [--json] [--dump FILE]

Attaches to rank R (default $RANK, else 0) of job ID, reads N batches
(default, or 0: until the producer's end), checks each batch's metadata as
`loader consume` does and reports throughput: one human line, or with --json
one JSON object. --dump FILE writes, per batch in order, its pixel bytes, then
its labels and then its indices (int64 little-endian): the same bytes as
`loader consume --dump`. per_batch_us is the time inside next and release
per batch less the time spent waiting for the producer. Exit status: 0 done (also at the producer's end
before N batches), 1 an error (message on stderr), 2 the producer is alive
but sent nothing for --timeout seconds, 128 + the signal after SIGINT or
SIGTERM (the report is printed, the producer told).
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

from . import Client, LoaderError, LoaderTimeout

PROG = "python3 -m numa_loader.consume"


class MetadataError(Exception):
    pass


class Stopped(BaseException):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class Checker:
    """The metadata a consumer relies on, checked as `loader consume` checks it."""

    def __init__(self, info, follow_position):
        self.info = info
        self.follow_position = follow_position  # off after --start-epoch, as in loader consume
        self.prev = None

    def check(self, b):
        wrong = None
        bpe = self.info.batches_per_epoch
        if self.prev is not None:
            pseq, pepoch, pbatch = self.prev
            if b.sequence != pseq + 1:
                wrong = "sequence does not follow"
            if self.follow_position:
                in_epoch = b.epoch == pepoch and b.batch == pbatch + 1
                next_epoch = b.epoch == pepoch + 1 and b.batch == 0 and pbatch + 1 == bpe
                if not in_epoch and not next_epoch:
                    wrong = "position does not follow the previous batch"
        if b.batch >= bpe:
            wrong = "batch number past the epoch"
        if b.size == 0 or b.size > self.info.batch_size:
            wrong = "size out of range"
        if b.size != self.info.batch_size and b.batch + 1 != bpe:
            wrong = "a short batch that is not the epoch's last"
        if wrong is None and b.size and int(b.labels.min()) < 0:
            wrong = "negative label %d (sample %d)" % (int(b.labels.min()), int(np.argmin(b.labels)))
        if wrong is None and b.size and int(b.indices.min()) < 0:
            wrong = "negative sample index %d" % int(b.indices.min())
        if wrong is not None:
            prev = "epoch %d, batch %d" % self.prev[1:] if self.prev else "none"
            raise MetadataError("batch %d (epoch %d, batch %d, %d samples): %s (previous: %s)"
                                % (b.sequence, b.epoch, b.batch, b.size, wrong, prev))
        self.prev = (b.sequence, b.epoch, b.batch)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a usage error is an error: exit 1
        self.print_usage(sys.stderr)
        print("%s: error: %s" % (self.prog, message), file=sys.stderr)
        sys.exit(1)


def parse_args(argv):
    p = _Parser(prog=PROG, description="Attach to a rank's loader service, read and check "
                                       "batches, report throughput (the twin of loader consume).")
    p.add_argument("--job-id", required=True, help="job id of the loader serve")
    p.add_argument("--rank", type=int, default=None, help="rank (default: $RANK, else 0)")
    p.add_argument("--batches", type=int, default=0,
                   help="batches to read (default, or 0: until the producer's end)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for a batch before reporting the producer stuck (60)")
    p.add_argument("--attach-timeout", type=float, default=30.0,
                   help="seconds to wait for the producer to appear (30)")
    p.add_argument("--start-epoch", type=int, default=-1, help="ask for batches from this epoch on")
    p.add_argument("--start-batch", type=int, default=0, help="... and this batch of it")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dump", metavar="FILE",
                   help="write each batch's pixels, labels and indices (int64 LE), in order, to FILE")
    a = p.parse_args(argv)
    if a.rank is None:
        env = os.environ.get("RANK", "")
        try:
            a.rank = int(env) if env else 0
        except ValueError:
            p.error("the environment variable RANK is %r, not a number" % env)
    if a.rank < 0:
        p.error("--rank must be 0 or more, not %d" % a.rank)
    if a.batches < 0:
        p.error("--batches must be 0 or more, not %d" % a.batches)
    for flag, v in (("--timeout", a.timeout), ("--attach-timeout", a.attach_timeout)):
        if not 0 <= v <= 1e7:
            p.error("%s must be 0..1e7 seconds, not %g" % (flag, v))
    if a.start_batch < 0 or (a.start_batch and a.start_epoch < 0):
        p.error("--start-batch takes a non-negative batch, with --start-epoch")
    return a


class Stats:
    def __init__(self):
        self.batches = self.images = 0
        self.in_calls = 0.0  # seconds inside next + release, less the waits for the producer
        self.seconds = 0.0
        self.epochs = set()
        self.first = self.last = (0, 0)
        self.end = ""
        self.producer_pid = 0
        self.attached = False


def consume(a, out, st):
    with Client(a.job_id, a.rank, timeout_s=a.timeout, attach_timeout_s=a.attach_timeout) as client:
        st.producer_pid = client.info.producer_pid
        st.attached = True
        if a.start_epoch >= 0:
            client.seek(a.start_epoch, a.start_batch)
        checker = Checker(client.info, follow_position=a.start_epoch < 0)
        b = None
        start = time.perf_counter()
        try:
            while a.batches == 0 or st.batches < a.batches:
                t0 = time.perf_counter()
                try:
                    b = next(client)  # releases the previous batch, then takes this one
                except StopIteration:
                    st.end = "the producer's last epoch is out"
                    break
                finally:
                    st.in_calls += time.perf_counter() - t0
                st.in_calls -= b.wait_s  # waiting for the producer is not the ring's cost
                checker.check(b)
                if out is not None:
                    out.write(b.pixels.data)
                    out.write(b.labels.astype("<i8", copy=False).data)
                    out.write(b.indices.astype("<i8", copy=False).data)
                if st.batches == 0:
                    st.first = (b.epoch, b.batch)
                st.last = (b.epoch, b.batch)
                st.epochs.add(b.epoch)
                st.batches += 1
                st.images += b.size
            if b is not None and not b.released:  # the last release is the consumer's cost too
                t0 = time.perf_counter()
                b.release()
                st.in_calls += time.perf_counter() - t0
        finally:
            st.seconds = time.perf_counter() - start


def report(a, st):
    n, secs = st.batches, st.seconds
    r = {
        "job_id": a.job_id,
        "rank": a.rank,
        "batches": n,
        "images": st.images,
        "seconds": secs,
        "images_per_s": st.images / secs if secs > 0 else 0.0,
        "batches_per_s": n / secs if secs > 0 else 0.0,
        "per_batch_us": st.in_calls * 1e6 / n if n else 0.0,
        "first_epoch": st.first[0],
        "first_batch": st.first[1],
        "last_epoch": st.last[0],
        "last_batch": st.last[1],
        "epochs": sorted(st.epochs),
        "producer_pid": st.producer_pid,
    }
    if st.end:
        r["end"] = st.end
    if a.json:
        return json.dumps(r)
    return ("consumed %d batches (%d images) of job %s, rank %d in %.2f s: %.0f images/s, "
            "%.1f batches/s; next+release cost %.1f us per batch%s" % (
                n, st.images, a.job_id, a.rank, secs, r["images_per_s"], r["batches_per_s"],
                r["per_batch_us"], "; " + st.end if st.end else ""))


def _stop(signum, frame):
    raise Stopped(signum)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    st = Stats()
    rc = 0
    out = None
    try:
        if a.dump:
            try:
                out = open(a.dump, "wb")
            except OSError as e:
                raise LoaderError("opening --dump %s: %s" % (a.dump, e.strerror)) from None
        consume(a, out, st)
    except Stopped as s:
        st.end = "stopped by " + signal.Signals(s.signum).name
        rc = 128 + s.signum
        if not st.attached:
            print("%s: %s while waiting for loader serve of job %s, rank %d" % (
                PROG, st.end, a.job_id, a.rank), file=sys.stderr)
    except LoaderTimeout as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        rc = 2
    except (LoaderError, MetadataError) as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        rc = 1
    except OSError as e:  # writing the dump
        print("%s: error: writing --dump %s failed: %s" % (PROG, a.dump, e), file=sys.stderr)
        rc = 1
    finally:
        if out is not None:
            try:
                out.close()
            except OSError as e:
                print("%s: error: writing --dump %s failed: %s" % (PROG, a.dump, e), file=sys.stderr)
                rc = rc or 1
    if rc == 0 or st.attached:  # as loader consume: the report after any attach
        print(report(a, st))
    return rc


if __name__ == "__main__":
    sys.exit(main())
