"""An example trainer that reads its input from the feedline data service.

torchrun starts one process per device; the processes share one job of the service
(``--job-name``): together they read each example of the epoch once, and train a linear model
with DistributedDataParallel (``Join`` lets a rank that runs out of batches first wait for the
others). The dataset is defined here and runs on the service's workers.

    torchrun --standalone --nproc-per-node 2 train.py --dispatcher feedline-dispatcher:5050

The token and TLS files come from the environment (``$FEEDLINE_SERVICE_TOKEN``,
``$FEEDLINE_TLS_*``), as for every feedline client. Each rank prints one JSON line
(``{"rank": R, "examples": N, "index_sum": S}``), then rank 0 the totals.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from feedline.data import Dataset
from feedline.service import distribute

FEATURES = 16


def example(index):
    """One synthetic example: features and a target the model can learn."""
    x = np.random.default_rng(int(index)).standard_normal(FEATURES).astype(np.float32)
    return {"index": index, "x": x, "y": np.float32(x.sum())}


def released(tensor, timeout=10.0):
    """Waits until gloo's worker thread has let go of ``tensor``, which it does just after the
    collective returns. It needs the interpreter to let go of a tensor made in Python: one that
    ends first aborts the process ("terminate called without an active exception")."""
    deadline = time.monotonic() + timeout
    while tensor._use_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.001)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--job-name", default="feedline-example", help="one per training run")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    dataset = (
        Dataset.range(args.examples)
        .map(example)
        .batch(args.batch_size)
        .apply(distribute("distributed_epoch", args.dispatcher, job_name=args.job_name))
    )
    examples = index_sum = 0
    loss = torch.zeros(())
    with Join([model]):
        for batch in dataset:
            x = torch.tensor(batch["x"], device=device)
            y = torch.tensor(batch["y"], device=device)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            examples += len(batch["index"])
            index_sum += int(batch["index"].sum())
    # One write per line: the ranks share torchrun's output, and an unbuffered print writes
    # the line and its newline apart, so that another rank's line can fall between them.
    summary = json.dumps({"rank": rank, "examples": examples, "index_sum": index_sum})
    sys.stdout.write(summary + "\n")
    sys.stdout.flush()
    totals = torch.tensor([examples, index_sum], dtype=torch.float64)
    dist.all_reduce(totals)
    released(totals)
    if rank == 0:
        print(f"trained on {int(totals[0])} examples, last loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
