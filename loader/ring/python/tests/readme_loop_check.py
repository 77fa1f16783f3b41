"""Runs the README's DDP loop (the python block under "Python (PyTorch DDP)
consumer") on CPU: torch.distributed with Gloo, world size 1. On a machine
without a GPU the CUDA calls map to the CPU: Tensor.cuda and Module.cuda
return the object itself, "nccl" becomes "gloo", DDP gets no device_ids, and
torch.cuda.current_stream().record_event() gives an event that counts its
synchronize() calls.

Usage: readme_loop_check.py README.md  (env: NL_JOB_ID, RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT; PYTHONPATH holds numa_loader)
"""
import math
import re
import sys

import torch
import torch.distributed as dist

text = open(sys.argv[1]).read()
section = text.split("## Python (PyTorch DDP) consumer", 1)[1]
code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
assert "release_after" in code and "non_blocking=True" in code, code

synced = []
losses = []


class Event:
    def synchronize(self):
        synced.append(len(losses))  # steps done when it was synchronized


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
exec(compile(code, "README.md (DDP loop)", "exec"), {"__name__": "__main__"})
steps = len(losses)
values = losses
assert steps >= 1, "the loop took no batch"
assert all(math.isfinite(v) for v in values), values
if not torch.cuda.is_available():
    assert len(synced) == steps, "%d events synchronized for %d steps" % (len(synced), steps)
dist.destroy_process_group()
print("README loop: %d steps, loss %.3f -> %.3f, %d events synchronized" % (
    steps, values[0], values[-1], len(synced)))
