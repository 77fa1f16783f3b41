"""Against a real `loader serve`: torch.from_numpy(batch.pixels) views the slot
and equals `loader consume --dump`'s bytes for the same serve options, and
release_after's event is synchronized while the slot still holds its batch.

Usage: views_check.py JOB_ID DUMP_FILE  (PYTHONPATH holds numa_loader)
"""
import sys
import warnings

import torch

import numa_loader

job, dump_path = sys.argv[1], sys.argv[2]
dump = open(dump_path, "rb").read()


class Event:
    """Stands in for a CUDA event; synchronize() copies the slot as it is then."""

    def __init__(self, batch, seen):
        self.batch, self.seen = batch, seen

    def synchronize(self):
        b = self.batch
        assert not b.released, "synchronize() after the slot was released (batch %d)" % b.sequence
        self.seen.append((b.sequence, b.pixels.tobytes()))


seen = []
off = 0
n = 0
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch's one warning about the read-only view
    with numa_loader.Client(job, 0, timeout_s=60) as client:
        info = client.info
        for b in client:
            assert [s for s, _ in seen] == list(range(b.sequence)), (b.sequence, [s for s, _ in seen])
            assert b.wait_s >= 0, b.wait_s
            t = torch.from_numpy(b.pixels)
            assert t.data_ptr() == b.pixels.ctypes.data, "torch.from_numpy copied"
            assert t.dtype == torch.uint8 and tuple(t.shape) == (b.size, 3, info.height, info.width)
            npix = b.size * info.sample_bytes
            want = torch.frombuffer(bytearray(dump[off:off + npix]), dtype=torch.uint8).view(t.shape)
            assert torch.equal(t, want), "batch %d: pixels differ from loader consume's" % b.sequence
            off += npix
            for name in ("labels", "indices"):
                got = torch.from_numpy(getattr(b, name))
                want = torch.frombuffer(bytearray(dump[off:off + 8 * b.size]), dtype=torch.int64)
                assert torch.equal(got, want), "batch %d: %s differ" % (b.sequence, name)
                off += 8 * b.size
            b.release_after(Event(b, seen))
            n += 1
assert off == len(dump), "read %d of the dump's %d bytes" % (off, len(dump))
assert [s for s, _ in seen] == list(range(n)), "an event per batch, each synchronized once"
# What each event saw in the slot is that batch's pixels, not a refill.
off = 0
for seq, px in seen:
    assert dump[off:off + len(px)] == px, "batch %d: the slot changed before synchronize()" % seq
    off += len(px) + 16 * (len(px) // info.sample_bytes)
print("%d batches: torch views equal loader consume's bytes; %d events synchronized in time" % (n, len(seen)))
