"""Rank 0 sends ranks 1 and 2 each a tensor that they receive LATE_S later; every rank then joins an all-reduce.

Run: torchrun --nproc-per-node 3 tests/programs/late_recv.py
Prints `timing 0 <send wait to 1> <send wait to 2>` (seconds each of rank 0's isend + wait took), `reduced
<rank> <time.monotonic()>` when a rank's all-reduce returned and `result <name> <rank> <sha256>` lines.
On gloo a send completes only once its receiver posted the recv (rank 0's wait lasts ~LATE_S, any size); the model of
prism's calibrated timeline has a send complete locally, which the timed emulation follows
(`prism.runtime.emulate.works.SendQueue`).
"""

import hashlib
import os
import time

import torch
import torch.distributed as dist

LATE_S = 1.0


def emit(name: str, rank: int, tensor: torch.Tensor) -> None:
    digest = hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
    os.write(1, f"result {name} {rank} {digest}\n".encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    message = torch.arange(1024, dtype=torch.float32)
    if rank == 0:
        times = []
        for dst in (1, 2):
            began = time.monotonic()
            sent = message * dst
            dist.isend(sent, dst).wait()
            times.append(time.monotonic() - began)
            sent.fill_(7.0)  # the buffer is the program's again once the wait returned
        os.write(1, f"timing 0 {times[0]:.4f} {times[1]:.4f}\n".encode())
    else:
        time.sleep(LATE_S * rank)  # rank 2 after rank 1's recv: each late against its own send
        dist.recv(message, 0)
        emit("message", rank, message)
    total = torch.full((16,), float(rank + 1))
    dist.all_reduce(total)
    os.write(1, f"reduced {rank} {time.monotonic():.4f}\n".encode())  # (one host: one monotonic clock)
    emit("total", rank, total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
