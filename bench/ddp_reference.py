"""A plain PyTorch DDP training script, the baseline of bench/trainer_bench.sh.

Run one process per rank under torchrun (Gloo on CPU, NCCL on GPU):
  python3 -m torch.distributed.run -r 2 -t 2 --nproc_per_node 2 bench/ddp_reference.py \\
      --source imagefolder --data TREE/train --steps 40 ...
  ... --source ring --data SHARD_SET --loader build/bin/loader   (needs PYTHONPATH=build/python)
  ... --source loader --data SHARD_SET                          (needs PYTHONPATH=build/python)

--source imagefolder is the incident's pipeline: torchvision ImageFolder of
PNGs + DataLoader workers (PIL decode, RandomCrop(32, padding=4), flip,
Resize, ToTensor, Normalize). --source ring starts a `loader serve` for this
rank (same transforms, in C++) and takes its batches through numa_loader's
Client; --source loader does the same through numa_loader.Loader (it starts
the server itself: the three lines a user changes). --transform imagenet
swaps CIFAR's crop for RandomResizedCrop (photographs) on every source.
Model, optimiser and step are the same for both: torchvision's resnet18/50,
DDP, SGD with momentum. Each rank prints one JSON line with its mean
data_time (waiting for the next batch, as the trainer measures it: copying
and normalising count as compute for both) and step_time, skipping warm-up
steps.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--source", choices=["imagefolder", "ring", "loader"], required=True)
    p.add_argument("--transform", choices=["cifar", "imagenet"], default="cifar")
    p.add_argument("--data", required=True)
    p.add_argument("--loader", help="the `loader` executable (--source ring)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the means")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--loader-threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(a.seed)
    model = getattr(torchvision.models, a.model)(num_classes=100).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    serve = None
    if a.source == "imagefolder":
        t = torchvision.transforms
        crop = [t.RandomCrop(32, padding=4), t.RandomHorizontalFlip(),
                t.Resize((a.image_size, a.image_size))] if a.transform == "cifar" else \
            [t.RandomResizedCrop(a.image_size), t.RandomHorizontalFlip()]
        tf = t.Compose(crop + [t.ToTensor(),
                               t.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        ds = torchvision.datasets.ImageFolder(a.data, transform=tf)
        sampler = torch.utils.data.distributed.DistributedSampler(ds, world, rank, seed=a.seed)
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                                         num_workers=a.workers, pin_memory=cuda,
                                         persistent_workers=a.workers > 0)

        def batches():
            epoch = 0
            while True:
                sampler.set_epoch(epoch)
                for x, y in dl:
                    yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                epoch += 1
    elif a.source == "loader":
        import numa_loader
        aug = dict(pad_crop=4) if a.transform == "cifar" else dict(random_resized_crop=True)
        loader = numa_loader.Loader(a.data, batch_size=a.batch_size, image_size=a.image_size,
                                    augment=True, seed=a.seed, threads=a.loader_threads,
                                    allow_shared_cores=True, quiet=True, timeout_s=300, **aug)

        def batches():  # the caller's own uint8 tensors; the step normalises them
            epoch = 0
            while True:
                loader.set_epoch(epoch)
                for x, y in loader:
                    yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                epoch += 1
    else:
        import numa_loader
        job = "ddpref-%s-%d" % (os.environ.get("MASTER_PORT", "0"), os.getppid())
        serve = subprocess.Popen(
            [a.loader, "serve", "--data", a.data, "--job-id", job, "--rank", str(rank),
             "--world-size", str(world), "--local-rank", str(local),
             "--batch-size", str(a.batch_size), "--image-size", str(a.image_size),
             "--augment"] + (["--pad-crop", "4"] if a.transform == "cifar" else ["--random-resized-crop"]) +
            ["--seed", str(a.seed), "--threads", str(a.loader_threads),
             "--allow-shared-cores", "--attach-timeout", "120"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = numa_loader.Client(job, rank, timeout_s=300, attach_timeout_s=120)

        def batches():  # the ring's uint8 batch; the step converts it (as our trainer does)
            for b in client:
                yield b, None

    it = batches()
    data, step = [], []
    for s in range(a.steps):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        if y is None:  # a ring batch: copy out (the slot goes back at the next batch), normalise
            b = x
            x = (torch.from_numpy(b.pixels).to(device, torch.float32) - mean) / std
            y = torch.from_numpy(b.labels).to(device, copy=True)
        elif x.dtype == torch.uint8:  # the Loader's batch: normalise (on the GPU where there is one)
            x = (x.to(torch.float32) - mean) / std
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        loss.item()
        t2 = time.perf_counter()
        if s >= a.skip:
            data.append(t1 - t0)
            step.append(t2 - t0)
    if serve is not None:
        client.close()
        serve.wait(timeout=30)
    if a.source == "loader":
        loader.close()
    d, st = sum(data) / len(data), sum(step) / len(step)
    print(json.dumps({"rank": rank, "source": a.source, "data_ms": 1000 * d, "step_ms": 1000 * st,
                      "images_per_s": a.batch_size / st, "steps": len(step)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
