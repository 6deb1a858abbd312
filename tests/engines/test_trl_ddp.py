"""The TRL drop-in on two processes (``torch.distributed.run``, gloo on CPU): one ledger
per rank, a global ledger on the main process equal to their sum, and the budget stop
decided from the global total, on the same optimizer step on both ranks."""

from __future__ import annotations

from race.accounting import PolicyCost
import json
import os
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _by_step_key(path: Path) -> dict:
    out: dict = defaultdict(lambda: defaultdict(int))
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out[r["step"]][f'{r["phase"]}/{r["component"]}'] += r["flops"]
    return {s: dict(v) for s, v in out.items()}


def _global_bound(model_dir: Path) -> int:
    """The two ranks' step bound at the maximum lengths (each rank generates every step)."""
    from race.accounting.trl_step import TrlStepPlan, counted, generation_components, update_components
    from race.models.refs import tiny_shape
    from race.models.tokenizer import build_char_tokenizer

    P = len(build_char_tokenizer()(text="Q:12+30-4\nA:")["input_ids"])  # the longest prompt
    T, shape = 4, tiny_shape("tiny-xs")
    plan = TrlStepPlan(per_device_train_batch_size=4, num_generations=4)
    rank = counted(generation_components(plan, PolicyCost(shape), n_seqs=4, prompt_len=P, completion_len=T)) + counted(
        update_components(plan, PolicyCost(shape), n_seqs=4, seq_len=P + T, completion_len=T))
    return 2 * rank


def _launch(model_dir: Path, out: Path, budget: float, max_steps: int, per_device: int = 4) -> list[dict]:
    """Run trl_ddp_worker.py on two gloo ranks; their rank<r>.json reports."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(HERE / "trl_ddp_worker.py"), str(model_dir), str(out),
           str(budget), str(max_steps), str(per_device)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks
        _, err = proc.communicate()
        pytest.fail(f"the 2-process run did not finish in 180 s: {err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_ranks_share_one_budget_and_stop_on_the_same_step(tiny_model_dir, tmp_path):
    bound = _global_bound(tiny_model_dir)
    budget, max_steps = 2.5 * bound, 10
    ranks = _launch(tiny_model_dir, tmp_path, budget, max_steps)
    assert [r["world"] for r in ranks] == [2, 2]
    # the same stop, on the same optimizer step, from the global total
    assert ranks[0]["global_step"] == ranks[1]["global_step"] < max_steps
    assert ranks[0]["stop_reason"] == ranks[1]["stop_reason"] == "budget"
    assert ranks[0]["global_total"] == ranks[1]["global_total"] <= budget
    assert ranks[0]["global_total"] + ranks[0]["rank_bound"] + ranks[1]["rank_bound"] > budget
    for r in ranks:  # each rank alone would have gone on: the stop came from the global total
        assert r["rank_total"] + r["rank_bound"] <= budget
    # the global ledger (main process) is the sum of the ranks' ledgers, step by step and key by key
    race = tmp_path / "race"
    glob, r0, r1 = (_by_step_key(race / n) for n in ("ledger.jsonl", "ledger.rank0.jsonl", "ledger.rank1.jsonl"))
    assert sorted(glob) == sorted(r0) == sorted(r1) == list(range(1, ranks[0]["global_step"] + 1))
    for step in glob:
        keys = set(r0[step]) | set(r1[step])
        assert glob[step] == {k: r0[step].get(k, 0) + r1[step].get(k, 0) for k in keys}, step
    assert ranks[0]["global_total"] == ranks[0]["rank_total"] + ranks[1]["rank_total"]
    assert r0 != r1  # the ranks generated different rows
    # TRL's logs carry the global total, one entry per step, on every rank
    for r in ranks:
        assert len(r["log_flops"]) >= r["global_step"] and r["log_flops"][-1] == r["global_total"]
    assert (race / "report_card.json").exists()
    card = json.loads((race / "report_card.json").read_text())
    assert card["total_flops"] == ranks[0]["global_total"] and card["extra"]["processes"] == 2


def test_per_device_batch_below_num_generations_runs_on_two_ranks(tiny_model_dir, tmp_path):
    """per_device_train_batch_size=2 < num_generations=4 on 2 ranks: TRL's global generation
    batch (4) holds full groups, so TRL accepts it; so must the ledger (it refused it)."""
    from race.accounting.trl_step import TrlStepPlan

    with pytest.raises(Exception, match="not a multiple of num_generations"):
        TrlStepPlan(per_device_train_batch_size=2, num_generations=4)  # one process: half a group
    assert TrlStepPlan(per_device_train_batch_size=4, num_generations=16, num_processes=8).generation_batch_size == 4
    ranks = _launch(tiny_model_dir, tmp_path, 1e15, 3, per_device=2)
    assert [r["global_step"] for r in ranks] == [3, 3] and [r["stop_reason"] for r in ranks] == [None, None]
    assert all(r["rank_rows"] == [2, 2, 2] for r in ranks)  # each rank generated half of each group
    race = tmp_path / "race"
    glob, r0, r1 = (_by_step_key(race / n) for n in ("ledger.jsonl", "ledger.rank0.jsonl", "ledger.rank1.jsonl"))
    assert sorted(glob) == [1, 2, 3]
    for step in glob:
        assert glob[step] == {k: r0[step].get(k, 0) + r1[step].get(k, 0) for k in set(r0[step]) | set(r1[step])}
    assert ranks[0]["global_total"] == ranks[0]["rank_total"] + ranks[1]["rank_total"] > 0
    # the utilisation logs: per-rank imbalance of the ranks' counted FLOPs, two devices' GPU-hours
    totals = [r["rank_total"] for r in ranks]
    for r in ranks:
        last = [h for h in r["log_history"] if "loss" in h][-1]
        assert last["race/imbalance/flops"] == pytest.approx(max(totals) / (sum(totals) / 2), rel=1e-12)
        assert last["race/gpu_hours"] > 0 and r["total_flos"] == float(ranks[0]["global_total"])
