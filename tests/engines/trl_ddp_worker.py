"""One rank of the 2-process TRL run of tests/engines/test_trl_ddp.py (launched by
``torch.distributed.run``; gloo on CPU). Writes ``rank<r>.json`` with what it saw."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(model_dir: str, out: str, budget: float, max_steps: int, per_device: int = 4) -> None:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    rank = int(os.environ["RANK"])
    model, tok = load_policy(model_dir, device="cpu", attn_implementation="eager")
    prompts = ["Q:1+2\nA:", "Q:12+30-4\nA:", "Q:3+4-5+6\nA:", "Q:9-1\nA:", "Q:7\nA:", "Q:40-2+1\nA:"]
    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=per_device, num_generations=4,
                      max_completion_length=4, max_steps=max_steps, report_to="none", disable_tqdm=True,
                      save_strategy="no", activation_checkpointing=False, ddp_backend="gloo", seed=0, logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c) % 3) for c in completions],
                          args=args, train_dataset=Dataset.from_dict({"prompt": prompts * 8}), processing_class=tok)
    cb = add_race_accounting(trainer, budget_flops=budget, output_dir=Path(out) / "race")
    trainer.train()
    report = {"rank": rank, "world": cb.ledgers.world, "global_step": trainer.state.global_step,
              "stop_reason": cb.stop_reason, "global_total": cb.ledger.total, "rank_total": cb.ledgers.rank_ledger.total,
              "rank_bound": cb.next_step_bound(trainer.state), "log_flops": [h["race/flops"] for h in
                                                                              trainer.state.log_history if "race/flops" in h],
              "log_history": trainer.state.log_history, "rank_rows": [g[0] for g in cb.tracker.generations],
              "total_flos": trainer.state.total_flos}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.barrier()
    # destroy_process_group() can deadlock in ProcessGroupGloo's destructor (its work thread
    # waits for the GIL the destructor holds): leave at once, every file written and closed
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), *map(int, sys.argv[5:6]))
