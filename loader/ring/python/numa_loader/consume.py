"""python3 -m numa_loader.consume: the Python twin of `loader consume`.

    python3 -m numa_loader.consume --job-id ID --rank R [--batches N] [--timeout S]
                                   [--json] [--dump FILE]

Attaches to rank R of job ID, reads N batches (default: until the producer's
end), checks each batch's metadata and reports throughput: one human line, or
with --json one JSON object. --dump FILE writes, per batch in order, its pixel
bytes, then its labels and then its indices (int64 little-endian), the same
bytes as `loader consume --dump`. Exit status: 0 done, 1 an error (message on
stderr), 2 the producer timed out.
"""

import argparse
import json
import sys
import time

import numpy as np

from . import Client, LoaderError, LoaderTimeout


class MetadataError(Exception):
    pass


class Checker:
    """The order and bounds every producer must keep, batch after batch."""

    def __init__(self, info):
        self.info = info
        self.prev = None

    def check(self, b):
        where = "batch sequence %d (epoch %d, batch %d)" % (b.sequence, b.epoch, b.batch)
        if self.prev is not None:
            pseq, pepoch, pbatch = self.prev
            if b.sequence != pseq + 1:
                raise MetadataError("%s: sequence %d follows %d" % (where, b.sequence, pseq))
            if b.epoch == pepoch:
                if b.batch != pbatch + 1:
                    raise MetadataError("%s: batch %d follows batch %d in epoch %d (want %d)"
                                        % (where, b.batch, pbatch, pepoch, pbatch + 1))
            elif b.epoch != pepoch + 1 or b.batch != 0:
                raise MetadataError("%s follows epoch %d batch %d: an epoch changes only to "
                                    "the next one, at batch 0" % (where, pepoch, pbatch))
        bpe = self.info.batches_per_epoch
        if bpe and b.batch >= bpe:
            raise MetadataError("%s: batch %d is past the epoch's %d batches" % (where, b.batch, bpe))
        if b.size < 1 or b.size > self.info.batch_size:
            raise MetadataError("%s: size %d is outside 1..%d" % (where, b.size, self.info.batch_size))
        labels = b.labels
        if labels.size and int(labels.min()) < 0:
            i = int(np.argmin(labels))
            raise MetadataError("%s: sample %d has label %d" % (where, i, int(labels[i])))
        self.prev = (b.sequence, b.epoch, b.batch)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a usage error is an error: exit 1, as `loader consume`'s
        self.print_usage(sys.stderr)
        print("%s: error: %s" % (self.prog, message), file=sys.stderr)
        sys.exit(1)


def parse_args(argv):
    p = _Parser(prog="python3 -m numa_loader.consume",
                                description="Read batches from a `loader serve` ring, check "
                                            "them and report throughput.")
    p.add_argument("--job-id", required=True, help="the job id given to `loader serve`")
    p.add_argument("--rank", type=int, required=True, help="the rank to attach to")
    p.add_argument("--batches", type=int, default=None,
                   help="batches to read (default: until the producer's end)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for the producer and for each batch (default 60)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dump", metavar="FILE",
                   help="write each batch's pixels, labels and indices (int64 LE) to FILE")
    a = p.parse_args(argv)
    if a.batches is not None and a.batches < 1:
        p.error("--batches must be at least 1, not %d" % a.batches)
    if a.rank < 0:
        p.error("--rank must be 0 or more, not %d" % a.rank)
    if not a.timeout > 0:
        p.error("--timeout must be more than 0 seconds")
    return a


def consume(a, out):
    stats = {"batches": 0, "images": 0, "in_calls": 0.0, "epochs": set(),
             "first": None, "last": None}
    with Client(a.job_id, a.rank, timeout_s=a.timeout) as client:
        checker = Checker(client.info)
        it = iter(client)
        b = None
        start = time.perf_counter()
        while a.batches is None or stats["batches"] < a.batches:
            t0 = time.perf_counter()
            try:
                b = next(it)  # releases the previous batch, then takes this one
            except StopIteration:
                break
            stats["in_calls"] += time.perf_counter() - t0
            checker.check(b)
            if out is not None:
                out.write(b.pixels.data)
                out.write(b.labels.astype("<i8", copy=False).data)
                out.write(b.indices.astype("<i8", copy=False).data)
            stats["batches"] += 1
            stats["images"] += b.size
            stats["epochs"].add(b.epoch)
            stats["first"] = stats["first"] or (b.epoch, b.batch)
            stats["last"] = (b.epoch, b.batch)
        if b is not None and not b.released:  # the last release is the consumer's cost too
            t0 = time.perf_counter()
            b.release()
            stats["in_calls"] += time.perf_counter() - t0
        stats["seconds"] = time.perf_counter() - start
    if a.batches is not None and stats["batches"] < a.batches:
        raise LoaderError("the producer of job %r rank %d ended after %d batches; %d were asked "
                          "for" % (a.job_id, a.rank, stats["batches"], a.batches))
    return stats


def report(a, s):
    secs = s["seconds"]
    n = s["batches"]
    first = s["first"] or (None, None)
    last = s["last"] or (None, None)
    r = {
        "job_id": a.job_id,
        "rank": a.rank,
        "batches": n,
        "images": s["images"],
        "seconds": secs,
        "images_per_s": s["images"] / secs if secs > 0 else 0.0,
        "batches_per_s": n / secs if secs > 0 else 0.0,
        "per_batch_us": s["in_calls"] * 1e6 / n if n else 0.0,
        "first_epoch": first[0],
        "first_batch": first[1],
        "last_epoch": last[0],
        "last_batch": last[1],
        "epochs": sorted(s["epochs"]),
    }
    if a.json:
        return json.dumps(r)
    span = ("epoch %d batch %d to epoch %d batch %d" % (first + last)) if n else "no batches"
    return ("job %s rank %d: %d batches, %d images in %.3f s: %.0f images/s, %.1f batches/s, "
            "%.1f us per batch in next+release; %s" % (
                a.job_id, a.rank, n, r["images"], secs, r["images_per_s"], r["batches_per_s"],
                r["per_batch_us"], span))


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    out = None
    try:
        if a.dump:
            try:
                out = open(a.dump, "wb")
            except OSError as e:
                raise LoaderError("cannot write --dump %s: %s" % (a.dump, e.strerror)) from None
        stats = consume(a, out)
        if out is not None:
            out.close()
            out = None
    except LoaderTimeout as e:
        print("python3 -m numa_loader.consume: %s" % e, file=sys.stderr)
        return 2
    except (LoaderError, MetadataError) as e:
        print("python3 -m numa_loader.consume: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("python3 -m numa_loader.consume: --dump %s: %s" % (a.dump, e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("python3 -m numa_loader.consume: interrupted", file=sys.stderr)
        return 130
    finally:
        if out is not None:
            out.close()
    print(report(a, stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
