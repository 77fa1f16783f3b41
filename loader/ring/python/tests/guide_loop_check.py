"""Runs the Python blocks of the user guide's Python page
(docs/guide/python.md: train.py, then the Client's loop) on CPU.

    guide_loop_check.py docs/guide/python.md loader DATA
        train.py, the Loader's loop: torch.distributed with Gloo, world size 1,
        its data set swapped for DATA and 90 epochs for 2. Checks every batch
        of each epoch trained once and tqdm was given a total.
    guide_loop_check.py docs/guide/python.md client
        the Client's loop, against a `loader serve` of $NL_JOB_ID: checks a
        release_after event was synchronized per batch.

On a machine without a GPU the CUDA calls map to the CPU: Tensor.cuda and
Module.cuda return the object itself, "nccl" becomes "gloo", DDP gets no
device_ids, and torch.cuda.current_stream().record_event() gives an event
that counts its synchronize() calls. (env: RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; PYTHONPATH holds numa_loader)
"""
import math
import os
import re
import sys

import torch
import torch.distributed as dist

text = open(sys.argv[1]).read()
mode = sys.argv[2]
blocks = re.findall(r"```python\n(.*?)```", text, re.S)
assert len(blocks) == 2, "%s has %d python blocks, not 2" % (sys.argv[1], len(blocks))

synced = []
losses = []
batches = []


class Event:
    def synchronize(self):
        synced.append(len(batches))


class Stream:
    def record_event(self):
        return Event()


if not torch.cuda.is_available():
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.current_stream = lambda *a, **k: Stream()
    _init = dist.init_process_group
    dist.init_process_group = lambda backend=None, **k: _init("gloo", **k)
    _DDP = torch.nn.parallel.DistributedDataParallel

    def ddp(module, device_ids=None, **k):
        return _DDP(module, **k)
    torch.nn.parallel.DistributedDataParallel = ddp

# Each step's loss, through the loss function the loop calls.
_ce = torch.nn.functional.cross_entropy


def ce(*a, **k):
    loss = _ce(*a, **k)
    losses.append(float(loss))
    return loss


torch.nn.functional.cross_entropy = ce

if mode == "loader":
    import numa_loader
    import tqdm as tqdm_module

    totals = []

    class Tqdm(tqdm_module.tqdm):
        def __init__(self, iterable=None, *a, **k):
            super().__init__(iterable, *a, **k)
            totals.append(self.total)

    tqdm_module.tqdm = Tqdm
    code = blocks[0]
    for want in ("numa_loader.Loader(", "set_epoch(epoch)", "tqdm(loader", "for x, y in"):
        assert want in code, "train.py has no %r" % want
    assert code.count('"~/data/c100"') == 1 and code.count("range(90)") == 1, code
    code = code.replace('"~/data/c100"', repr(sys.argv[3])).replace("range(90)", "range(2)")
    code = code.replace("image_size=224", "image_size=32")  # the same loop, a CPU's step

    made = []
    _Loader = numa_loader.Loader

    def loader(*a, **k):
        made.append(_Loader(*a, **k))
        return made[-1]
    numa_loader.Loader = loader
    exec(compile(code, "python.md (train.py)", "exec"), {"__name__": "__main__"})
    n = len(made[0])
    assert made[0].closed, "the with block closed the Loader"
    assert len(losses) == 2 * n, "%d steps for 2 epochs of %d batches" % (len(losses), n)
    assert totals == [n, n], "tqdm's totals: %r" % totals
    assert all(math.isfinite(v) for v in losses), losses
    dist.destroy_process_group()
    print("guide train.py: 2 epochs of %d batches, loss %.3f -> %.3f" % (n, losses[0], losses[-1]))
else:
    code = blocks[1]
    assert "release_after" in code and "non_blocking=True" in code, code
    assert code.count('"run1"') == 1, code
    code = code.replace('"run1"', repr(os.environ["NL_JOB_ID"]))
    code = code.replace("        x = torch", "        batches.append(b.batch)\n        x = torch", 1)
    exec(compile(code, "python.md (Client loop)", "exec"),
         {"__name__": "__main__", "rank": 0, "numa_loader": __import__("numa_loader"),
          "torch": torch, "os": os, "batches": batches})
    assert batches, "the loop took no batch"
    if not torch.cuda.is_available():
        assert len(synced) == len(batches), "%d events synchronized for %d batches" % (
            len(synced), len(batches))
    print("guide Client loop: %d batches, %d events synchronized" % (len(batches), len(synced)))
