"""Every rank adds its rank + 1 each round (a gloo all_reduce): a peer that dies or hangs leaves the others
waiting in the collective, as in real multi-node training. Each round is a training step to the progress watch
(every rank logs it); rank 0 registers what they agreed on."""

import json
import time

import torch
import torch.distributed as dist

from nemotron.errors import UserError
from nemotron.runtime.step import StepRun

run = StepRun.start(__file__)
cfg = run.config
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = 0.0
for i in range(1, cfg.rounds + 1):
    if i == cfg.fail_at_round:
        kind = UserError if cfg.fail_with == "user" else RuntimeError
        raise kind(f"round {i}: rank {rank} fails on purpose (fail_at_round)")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    total += float(t.item())
    if rank == 0:
        print(f"round {i}/{cfg.rounds}: {world} ranks agree on {t.item():.0f}", flush=True)
    run.log_metrics(i, {"agreed": float(t.item())})
    time.sleep(cfg.sleep_s)
if rank == 0:
    out = run.output_dir("result").with_suffix(".jsonl")
    out.write_text(json.dumps({"prompt": f"{world} ranks, total {total:.0f}"}) + "\n")
    run.register_outputs({"result": out})
dist.destroy_process_group()
