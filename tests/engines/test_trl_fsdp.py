"""FSDP shown, on CPU: FSDP2 (``fully_shard``, what accelerate's ``fsdp_config={"version": 2}``
builds) on two gloo ranks with accelerate's activation checkpointing (``CheckpointWrapper``):
the ledger's hooks fire on the sharded model, read its full shape, record the recompute, and
charge what FlopCounterMode counts for the same calls on the unsharded model.

Through TRL itself FSDP needs GPUs here: with ``use_cpu=True`` accelerate runs plain DDP
(``fsdp=...`` is not applied), so the TRL-level FSDP run belongs to ``benchmarks/gpu_check.py``.
DeepSpeed is not installed: its reward-model wrapper is covered by a stand-in
(tests/engines/test_trl_reward_model.py)."""

from __future__ import annotations

from race.accounting import PolicyCost
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_sharded_checkpointed_model_is_charged_like_the_unsharded_one(tmp_path):
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from race.accounting.trl_step import calls_components
    from race.engines.trl.hooks import FlopTracker
    from race.measure import Counter
    from race.models.family import build_tiny_model
    from race.models.refs import model_shape

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(HERE / "trl_fsdp_worker.py"), str(tmp_path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the FSDP run did not finish in 180 s: {err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    for r in (0, 1):
        rep = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rep["model_class"].startswith("FSDP") and rep["same_shape"] and not rep["lora"]
        n_layers = build_tiny_model("tiny-xs", seed=0).config.num_hidden_layers
        assert rep["calls"] == [["update", "early_stop", n_layers, 2, 9], ["old_logprobs", None, 0, 2, 9]]
        # the same calls on the unsharded model, counted by FlopCounterMode
        lm = build_tiny_model("tiny-xs", seed=0)
        for i, layer in enumerate(lm.model.layers):
            lm.model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
        lm.train()
        tracker = FlopTracker()
        tracker.attach(lm)
        ids = torch.tensor(rep["ids"])
        with Counter() as c:
            lm(input_ids=ids, use_cache=False).logits.float().sum().backward()
            with torch.no_grad():
                lm(input_ids=ids, use_cache=False)
        plain = calls_components(PolicyCost(model_shape(lm), None, "torch"), tracker.drain())
        assert rep["components"] == plain and sum(plain.values()) == c.total
        assert plain["recompute/forward"] > 0
