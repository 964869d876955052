# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A real (tiny) DDP training job for the real-torchrun tests: torchrun, gloo on CPU, DataLoader workers.

Run under ``torchrun --standalone --nproc_per_node=N train.py --ckpt-dir DIR ...``. Nothing here is
fake: real ``torch.distributed`` process groups, a real ``DistributedDataParallel`` model, a real
``DataLoader`` with ``num_workers`` forked workers, ``torch.save`` checkpoints written atomically (a
``.tmp`` file, fsync, rename). Only the GPUs are stand-ins: with ``--hold PATTERN`` each rank keeps the
file ``PATTERN % LOCAL_RANK`` open read-write for its life, as a CUDA rank holds ``/dev/nvidiaN``
(its forked DataLoader workers inherit the descriptor, as they do the real one).

Rank 0 prints ``step N`` lines (flushed) and ``saved step N PATH`` after each checkpoint.

Signals: SIGINT and SIGTERM set a stop flag (the step in flight finishes; the ranks agree on the flag with
an all-reduce, so no rank is left waiting in a collective), then rank 0 saves a checkpoint (stretched over
``--save-seconds`` in chunks, as a large save is) and every rank exits 0. With ``--ignore-signals`` the ranks
ignore both (their DataLoader workers too) and keep training; ``--ckpt-every K`` saves every K steps while
training.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

STOP = []


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--ckpt-every", type=int, default=0, help="save every K steps while training (0: never)")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds each step takes at least")
    parser.add_argument("--save-seconds", type=float, default=0.0, help="stretch the save after a signal")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--ignore-signals", action="store_true")
    parser.add_argument("--hold", default="", help="a file per local rank (PATTERN %% LOCAL_RANK) held open")
    parser.add_argument("--data", default=None, help="the training set (a file or a directory); must exist")
    parser.add_argument("--resume-from", default=None, help="a checkpoint this job saved: resume after its step")
    args = parser.parse_args(argv)
    if args.data is not None and not os.path.exists(args.data):
        parser.exit(2, "train.py: --data %s: no such file or directory\n" % args.data)
    return args


def say(text: str) -> None:
    """Print a line; a terminal that went away (the tmux pane closed with a killed launcher) is not fatal,
    as it is not for the ``logging`` module most training code prints through (StreamHandler.handleError)."""
    try:
        print(text, flush=True)
    except OSError:
        pass


def on_signal(signum, frame):
    STOP.append(signum)


def ignore_in_worker(_worker_id: int) -> None:
    """worker_init_fn for --ignore-signals: torch's DataLoader worker loop installs its own handlers, so
    without this a SIGTERM to the process group kills the workers and with them their rank."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def save(model: torch.nn.Module, step: int, ckpt_dir: str, seconds: float) -> str:
    """torch.save into memory, written to ``<name>.tmp`` in chunks over ``seconds``, fsync, rename."""
    buffer = io.BytesIO()
    # a real torch.save archive of a few hundred KiB (the padding tensor), written in chunks to stretch over `seconds`
    torch.save({"step": step, "model": model.state_dict(), "pad": torch.zeros(64 * 1024)}, buffer)
    data = buffer.getvalue()
    final = os.path.join(ckpt_dir, "ckpt-%06d.pt" % step)
    chunks = 8
    size = -(-len(data) // chunks)
    with open(final + ".tmp", "wb") as handle:
        for index in range(chunks):
            handle.write(data[index * size:(index + 1) * size])
            handle.flush()
            if seconds:
                time.sleep(seconds / chunks)
        os.fsync(handle.fileno())
    os.rename(final + ".tmp", final)
    return final


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    handler = signal.SIG_IGN if args.ignore_signals else on_signal
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    held = os.open(args.hold % int(os.environ["LOCAL_RANK"]), os.O_RDWR) if args.hold else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data), num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0,
                        worker_init_fn=ignore_in_worker if args.ignore_signals else None)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    step = 0
    if args.resume_from:
        # torch.load raises on a torn archive: the job dies at start, as a real one would
        state = torch.load(args.resume_from)
        model.module.load_state_dict(state["model"])
        step = int(state["step"])
        if rank == 0:
            say("resumed from %s at step %d" % (args.resume_from, step))
    if rank == 0 and args.data:
        say("data %s" % args.data)
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        for inputs, targets in loader:
            began = time.monotonic()
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0:
                say("step %d loss %.4f" % (step, loss.item()))
            flag = torch.tensor([1.0 if STOP else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops after the same step
            if flag.item():
                if rank == 0:
                    say("stopping after step %d (signal)" % step)
                    path = save(model.module, step, args.ckpt_dir, args.save_seconds)
                    say("saved step %d %s" % (step, path))
                dist.barrier()
                dist.destroy_process_group()
                if held is not None:
                    os.close(held)
                return 0
            if args.ckpt_every and step % args.ckpt_every == 0 and rank == 0:
                say("saved step %d %s" % (step, save(model.module, step, args.ckpt_dir, 0.0)))
            time.sleep(max(0.0, args.step_sleep - (time.monotonic() - began)))
        epoch += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
