"""Step throughput: RACE's built-in GRPO engine vs TRL's GRPOTrainer, same step shapes.

    .venv/bin/python benchmarks/engine_speed.py [--sizes tiny-xs,tiny-s] [--groups 4,8]
                                               [--lengths 16,64] [--steps 4] [--rounds 2]

Both engines run the same work per step: the same randomly initialised tiny model (it
rarely emits EOS, so every completion runs to ``max_completion_length`` in both), LoRA r=8
on all linear layers, ``prompts x G`` completions, a random 0/1 reward (groups have
variance, so both update on every sequence), beta 0, one update per batch, no gradient
checkpointing (TRL's default turns it on: a second TRL column shows that default). They
alternate in blocks of ``--steps`` steps for ``--rounds`` rounds in one process; the table
gives median seconds per step, the ratio TRL / builtin, and the builtin engine's achieved
FLOP/s (model FLOPs from its ledger, ``race`` conventions).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_model_dir(size: str, root: Path) -> Path:
    from race.models import build_char_tokenizer, build_tiny_model

    d = root / size
    if not d.exists():
        build_tiny_model(size, seed=0).save_pretrained(d, safe_serialization=True)
        build_char_tokenizer().save_pretrained(d)
    return d


def builtin_engine(model_dir: Path, prompts: int, group: int, length: int, tmp: Path):
    from race.accounting import FlopLedger
    from race.spec.run import run_config_from_dict
    from race.engines.builtin import BuiltinEngine
    from race.engines.run_io import MetricsLog

    cfg = run_config_from_dict(dict(model=str(model_dir), budget_flops=1e18, prompts_per_step=prompts,
                                    num_generations=group, max_completion_length=length, reward="random",
                                    lora={"r": 8, "lora_alpha": 8}, learning_rate=1e-4, attn_implementation="sdpa"))
    eng = BuiltinEngine(cfg, tmp)
    eng._setup()
    eng.ledger = FlopLedger()
    eng.metrics = MetricsLog(tmp / f"m-{time.monotonic_ns()}.jsonl")
    eng.total_steps = 10_000
    state = {"step": 0}

    def step() -> tuple[float, int]:
        state["step"] += 1
        s = state["step"]
        problems, ids, mask = eng._prompts(s)
        before = eng.ledger.total
        t0 = time.perf_counter()
        eng._train_step(s, problems, ids, mask)
        return time.perf_counter() - t0, eng.ledger.total - before

    return step


def trl_trainer(model_dir: Path, prompts: int, group: int, length: int, tmp: Path, checkpointing: bool):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from race.tasks import ArithTask

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    probs = ArithTask().problems("train", 2048, seed=1)
    ds = Dataset.from_list([{"prompt": p.prompt} for p in probs])
    rng = random.Random(0)

    def reward(completions, **_):
        return [float(rng.random() < 0.5) for _ in completions]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=prompts * group,
                      num_generations=group, max_completion_length=length, learning_rate=1e-4, beta=0.0,
                      num_iterations=1, gradient_checkpointing=checkpointing, report_to="none", logging_steps=1000,
                      save_strategy="no", max_steps=10_000, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=LoraConfig(r=8, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
                          callbacks=[Timer()])

    class Stop(TrainerCallback):
        def __init__(self) -> None:
            self.budget = 0

        def on_step_end(self, args, state, control, **kw):
            self.budget -= 1
            if self.budget <= 0:
                control.should_training_stop = True

    stopper = Stop()
    trainer.add_callback(stopper)

    def block(n: int) -> list[float]:
        start = len(times)
        stopper.budget = n
        trainer.args.max_steps = trainer.state.global_step + n if trainer.state.global_step else n
        trainer.train(resume_from_checkpoint=None)
        return times[start:]

    return block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny-xs,tiny-s,tiny-m")
    ap.add_argument("--groups", default="4,8")
    ap.add_argument("--lengths", default="16,64")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-trl-default", action="store_true", help="skip the TRL-defaults (checkpointing) column")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    print(f"$ {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"torch {torch.__version__}, {a.threads} threads, {a.prompts} prompts/step, medians of "
          f"{a.rounds} rounds x {a.steps} steps (alternating blocks)\n")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        for size in a.sizes.split(","):
            mdir = make_model_dir(size, root)
            for g in (int(x) for x in a.groups.split(",")):
                for L in (int(x) for x in a.lengths.split(",")):
                    b_step = builtin_engine(mdir, a.prompts, g, L, root)
                    t_block = trl_trainer(mdir, a.prompts, g, L, root, checkpointing=False)
                    t_def = None if a.no_trl_default else trl_trainer(mdir, a.prompts, g, L, root, checkpointing=True)
                    b_step()  # warm-up both
                    t_block(1)
                    if t_def:
                        t_def(1)
                    bt, tt, dt, fl = [], [], [], []
                    for _ in range(a.rounds):
                        for _ in range(a.steps):
                            s, f = b_step()
                            bt.append(s)
                            fl.append(f / s)
                        tt += t_block(a.steps)
                        if t_def:
                            dt += t_def(a.steps)
                    mb, mt = statistics.median(bt), statistics.median(tt)
                    md = statistics.median(dt) if dt else float("nan")
                    rows.append((size, g, L, mb, mt, mt / mb, md / mb, statistics.median(fl)))
                    print(f"  {size} G={g} L={L}: builtin {mb:.3f}s  trl {mt:.3f}s  ratio {mt / mb:.2f}x", flush=True)
    print("\n| model | G | completion | builtin s/step | TRL s/step | TRL / builtin | TRL default (ckpt) / builtin | builtin GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for size, g, L, mb, mt, r, rd, f in rows:
        print(f"| {size} | {g} | {L} | {mb:.3f} | {mt:.3f} | {r:.2f}x | {rd:.2f}x | {f / 1e9:.2f} |")
    ratios = [r[5] for r in rows]
    print(f"\nmedian TRL/builtin ratio: {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
