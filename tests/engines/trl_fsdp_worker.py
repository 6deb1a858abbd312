"""One rank of the FSDP2 run of tests/engines/test_trl_fsdp.py (``torch.distributed.run``,
gloo on CPU): the tiny model sharded with ``fully_shard`` per decoder layer and at the root,
each layer in accelerate's ``CheckpointWrapper`` (what ``fsdp_config={"version": 2,
"activation_checkpointing": True}`` builds), hooked by the ledger, one training forward +
backward and one no-grad forward. Writes ``rank<r>.json``."""

from __future__ import annotations

from race.accounting import PolicyCost
import json
import os
import sys
from pathlib import Path


def main(out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    from race.accounting.trl_step import calls_components
    from race.engines.trl.hooks import FlopTracker, lora_of
    from race.models.family import build_tiny_model
    from race.models.refs import model_shape

    rank = dist.get_rank()
    lm = build_tiny_model("tiny-xs", seed=0)
    plain_shape = model_shape(lm)
    for i, layer in enumerate(lm.model.layers):
        lm.model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    for layer in lm.model.layers:
        fully_shard(layer)
    fully_shard(lm)
    lm.train()
    shape = model_shape(lm)  # read from the sharded model, as the callback does at train begin
    tracker = FlopTracker()
    tracker.attach(lm)
    ids = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(rank))
    lm(input_ids=ids, use_cache=False).logits.float().sum().backward()
    with torch.no_grad():
        lm(input_ids=ids, use_cache=False)
    calls = tracker.drain()
    report = {"rank": rank, "model_class": type(lm).__name__, "same_shape": shape == plain_shape,
              "lora": lora_of(lm, shape) is not None, "ids": ids.tolist(),
              "calls": [[c.phase, c.recompute, c.recompute_layers, c.batch, c.new_tokens] for c in calls],
              "components": calls_components(PolicyCost(shape, None, "torch"), calls)}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    os._exit(0)  # see trl_ddp_worker.py: gloo's destructor can deadlock


if __name__ == "__main__":
    main(sys.argv[1])
