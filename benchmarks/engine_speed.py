"""Step throughput: RACE's built-in GRPO engine vs TRL's GRPOTrainer, same step shapes.

    .venv/bin/python benchmarks/engine_speed.py [--quick] [--levers] [--sizes tiny-xs,tiny-s]
                                               [--groups 4,8] [--lengths 16,64] [--steps 2] [--rounds 2]
                                               [--gang 2,4,8]

Both engines run the same GRPO step (the built-in engine executes fewer FLOPs for it: it
prefills each prompt once and runs its log-prob and update passes with each prompt once
per group; the ledgers charge what each executes): the same randomly initialised tiny model (it
rarely emits EOS, so every completion runs to ``max_completion_length`` in both), LoRA r=8
on all linear layers, ``prompts x G`` completions, a random 0/1 reward (groups have
variance, so both update on every sequence), beta 0, one update per batch, no gradient
checkpointing (TRL's default turns it on: a second TRL column shows that default). They
alternate in blocks of ``--steps`` steps for ``--rounds`` rounds in one process (so load
from other processes hits all of them alike); the table gives median seconds per step, the
ratios TRL / builtin, and the share of a one-thread matmul peak (measured at the model's
MLP shape once per round, so under the same load as the steps) that the builtin engine's
rollout and update phases reach (FLOPs and
seconds from its ledger, ``torch`` conventions: what executes). The default grid is
tiny-xs..tiny-l x G {4,8,16} x completion {16,32,64} on one thread; ``--quick`` runs
tiny-s and tiny-m at G=8, completion 32. ``--levers`` times the built-in step with the
LoRA merge and the functional log-prob forward switched off, one at a time, interleaved.
``--gang 2,4,8`` times a gang of K members (``race.engines.gang``: one batched step for K
LoRA runs of the same base, seeds differing) against K solo built-in steps and against
TRL at the same per-member shapes (``--no-trl`` leaves TRL out), interleaved; the ratios
are run-steps per second: gang over solo (K solo step seconds / gang step seconds) and
gang over TRL (K TRL step seconds / gang step seconds, TRL training one run at a time).
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
    """A random tiny model's directory, or an imported pretrained model's (``smollm2-135m``:
    its real weights; ``race base import smollm2`` first)."""
    from race.models import build_char_tokenizer, build_tiny_model
    from race.models.imported import imported_path, is_imported_name

    if is_imported_name(size):
        return imported_path(size)
    d = root / size
    if not d.exists():
        build_tiny_model(size, seed=0).save_pretrained(d, safe_serialization=True)
        build_char_tokenizer().save_pretrained(d)
    return d


def mlp_shape(size: str) -> tuple[int, int]:
    """(hidden, intermediate) of a tiny size or an imported model: the matmul peak's shape."""
    from race.models.refs import resolve_shape

    shape = resolve_shape(size)
    return shape.hidden, shape.intermediate


def grid_points(a, root: Path):
    """(size, model directory, group size, completion length) over the benchmark grid."""
    for size in a.sizes.split(","):
        mdir = make_model_dir(size, root)
        for g in (int(x) for x in a.groups.split(",")):
            for L in (int(x) for x in a.lengths.split(",")):
                yield size, mdir, g, L


def builtin_engine(model_dir: Path, prompts: int, group: int, length: int, tmp: Path, *, merge: bool = True,
                   fast_forward: bool = True):
    """A step function of the built-in engine; ``merge`` / ``fast_forward`` off switch
    the LoRA merge for the rollout and the functional log-prob forward off (the levers)."""
    from race.accounting import FlopLedger
    from race.spec.run import run_config_from_dict
    from race.engines.builtin import BuiltinEngine
    from race.engines.grpo_math import completion_logprobs
    from race.engines.run_io import MetricsLog
    from race.engines.sampling import sample, sampling_generator

    cfg = run_config_from_dict(dict(model=str(model_dir), budget_flops=1e18, prompts_per_step=prompts,
                                    num_generations=group, max_completion_length=length, reward="random",
                                    lora={"r": 8, "lora_alpha": 8}, learning_rate=1e-4, attn_implementation="sdpa",
                                    conventions="torch"))
    eng = BuiltinEngine(cfg, tmp)
    eng.start()
    eng.open_books(None, 10_000, ledger=FlopLedger(), metrics=MetricsLog(tmp / f"m-{time.monotonic_ns()}.jsonl"))
    if not merge:
        def rollout(step, ids, mask):
            gen = sampling_generator(cfg.seed, step)
            st = eng.state
            st.model.eval()
            return sample(st.model, ids, mask, group=group, max_new_tokens=length, eos_id=st.tok.eos_token_id,
                          pad_id=st.tok.pad_token_id, temperature=cfg.temperature, generator=gen, merge_lora=False)
        eng.rollout = rollout
    if not fast_forward:
        eng._logprobs = lambda model, ro: completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                                               ro.completion_mask, cfg.temperature, fast=False)
    state = {"step": 0}

    def step() -> tuple[float, dict[str, tuple[int, float]]]:
        """Seconds of one step, and (FLOPs, seconds) per phase from its ledger records."""
        state["step"] += 1
        s = state["step"]
        problems, ids, mask = eng.prompts_at(s)
        n = len(eng.books.ledger)
        t0 = time.perf_counter()
        eng._train_step(s, problems, ids, mask)
        wall = time.perf_counter() - t0
        phases: dict[str, tuple[int, float]] = {}
        for r in eng.books.ledger.records[n:]:
            f, sec = phases.get(r.phase, (0, 0.0))
            phases[r.phase] = (f + r.flops, sec + r.seconds)
            if r.key == "rollout/decode":  # its tokens: the completion tokens generated
                lengths.append(r.tokens / (prompts * group))
        return wall, phases

    step.lengths = lengths = []  # mean completion length of each step

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

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    lengths: list[float] = []  # mean completion length of each step

    args = GRPOConfig(output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=prompts * group,
                      num_generations=group, max_completion_length=length, learning_rate=1e-4, beta=0.0,
                      num_iterations=1, gradient_checkpointing=checkpointing, report_to="none", logging_steps=1,
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

    block.lengths = lengths
    return block


def _suppressed(fn, *a):
    """Run ``fn`` with stdout (TRL's end-of-train log dicts) thrown away."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*a)


def _span(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x (min {min(xs):.2f}x, max {max(xs):.2f}x)"


def run_grid(a) -> None:
    from engine_profile import matmul_peak

    rows = []
    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        for size, mdir, g, L in grid_points(a, root):
            b_step = builtin_engine(mdir, a.prompts, g, L, root)
            t_block = trl_trainer(mdir, a.prompts, g, L, root, checkpointing=False)
            t_def = None if a.no_trl_default else trl_trainer(mdir, a.prompts, g, L, root, checkpointing=True)
            b_step()  # warm-up all
            _suppressed(t_block, 1)
            if t_def:
                _suppressed(t_def, 1)
            bt, tt, dt, pk = [], [], [], []
            ph: dict[str, list[float]] = {"rollout": [0, 0.0], "update": [0, 0.0]}
            mlp = mlp_shape(size)
            for _ in range(a.rounds):  # interleaved: peak, builtin, TRL, TRL defaults, ...
                pk.append(matmul_peak(2048, *mlp, repeats=5))
                for _ in range(a.steps):
                    sec, phases = b_step()
                    bt.append(sec)
                    for k in ph:
                        f, t = phases.get(k, (0, 0.0))
                        ph[k][0] += f
                        ph[k][1] += t
                tt += _suppressed(t_block, a.steps)
                if t_def:
                    dt += _suppressed(t_def, a.steps)
            mb, mt = statistics.median(bt), statistics.median(tt)
            md = statistics.median(dt) if dt else float("nan")
            peak = statistics.median(pk)  # measured in the rounds: the same load as the steps
            share = {k: (f / t / peak if t else 0.0) for k, (f, t) in ph.items()}
            lens = f"{statistics.mean(b_step.lengths):.1f} / {statistics.mean(t_block.lengths):.1f}"
            rows.append((size, g, L, mb, mt, md, mt / mb, md / mb, share["rollout"], share["update"], lens))
            print(f"  {size} G={g} L={L}: builtin {mb:.3f}s  trl {mt:.3f}s ({mt / mb:.2f}x)  "
                  f"trl default {md:.3f}s ({md / mb:.2f}x)  completion tokens {lens}", flush=True)
    print("\n| model | G | completion | builtin s/step | TRL s/step | TRL default s/step | TRL / builtin | "
          "TRL default / builtin | rollout % peak | update % peak | mean completion builtin / TRL |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size, g, L, mb, mt, md, r, rd, sr, su, lens in rows:
        print(f"| {size} | {g} | {L} | {mb:.3f} | {mt:.3f} | {md:.3f} | {r:.2f}x | {rd:.2f}x | {100 * sr:.1f}% | "
              f"{100 * su:.1f}% | {lens} |")
    print("(% peak: the phase's FLOPs per second over the matmul peak measured in the same rounds; a "
          "pretrained model ends completions at EOS, so the two engines' lengths are sampled, not equal)")
    print(f"\nTRL (same settings) / builtin: {_span([r[6] for r in rows])} over {len(rows)} configurations")
    if not a.no_trl_default:
        print(f"TRL (defaults: gradient checkpointing) / builtin: {_span([r[7] for r in rows])}")


def gang_members(model_dir: Path, prompts: int, group: int, length: int, tmp: Path, seeds: range):
    """Built-in engines ready to step (no run directory), one per seed."""
    from race.accounting import FlopLedger
    from race.engines.builtin import BuiltinEngine
    from race.engines.run_io import MetricsLog
    from race.spec.run import run_config_from_dict

    engs = []
    for seed in seeds:
        cfg = run_config_from_dict(dict(model=str(model_dir), budget_flops=1e18, prompts_per_step=prompts,
                                        num_generations=group, max_completion_length=length, reward="random",
                                        lora={"r": 8, "lora_alpha": 8}, learning_rate=1e-4, conventions="torch",
                                        seed=seed))
        e = BuiltinEngine(cfg, tmp)
        e.start()
        e.open_books(None, 10_000, ledger=FlopLedger(), metrics=MetricsLog(tmp / f"m-{time.monotonic_ns()}.jsonl"))
        engs.append(e)
    return engs


def run_gangs(a) -> None:
    """Run-steps per second of a gang of K members against K solo built-in runs and, unless
    ``--no-trl``, against TRL's GRPOTrainer at the same per-member shapes (TRL runs one
    LoRA run per process, so K of its run-steps take K of its steps). All three are timed
    interleaved in one process: per round a block of ``--steps`` TRL steps, then step by
    step K solo steps and one gang step."""
    from race.engines.gang.forward import share_base
    from race.engines.gang.step import Work, gang_step

    ks = [int(k) for k in a.gang.split(",")]
    trl = not a.no_trl
    print("| model | G | completion | K | K solo steps s | gang step s | gang / solo run-steps per s |"
          + (" TRL step s | gang / TRL run-steps per s |" if trl else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|" if trl else ""))
    ratios: dict[int, list[float]] = {k: [] for k in ks}
    vs_trl: dict[int, list[float]] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        for size, mdir, g, L in grid_points(a, root):
            t_block = trl_trainer(mdir, a.prompts, g, L, root, checkpointing=False) if trl else None
            if t_block:
                _suppressed(t_block, 1)  # warm-up
            for k in ks:
                solo = gang_members(mdir, a.prompts, g, L, root, range(k))
                gang = gang_members(mdir, a.prompts, g, L, root, range(k))
                share_base([e.state.model for e in gang])  # one frozen base in memory, as GangEngine runs it
                state = {"solo": 0, "gang": 0}

                def solo_steps() -> float:
                    state["solo"] += 1
                    s = state["solo"]
                    t0 = time.perf_counter()
                    for e in solo:
                        e._train_step(s, *e.prompts_at(s))
                    return time.perf_counter() - t0

                def gang_once() -> float:
                    state["gang"] += 1
                    s = state["gang"]
                    t0 = time.perf_counter()
                    gang_step(s, [Work(i, e, *e.prompts_at(s)) for i, e in enumerate(gang)])
                    return time.perf_counter() - t0

                solo_steps(), gang_once()  # warm-up
                ts, tg, tt = [], [], []
                for _ in range(a.rounds):
                    if t_block:
                        tt += _suppressed(t_block, a.steps)
                    for _ in range(a.steps):  # interleaved step by step
                        ts.append(solo_steps())
                        tg.append(gang_once())
                ms, mg = statistics.median(ts), statistics.median(tg)
                ratios[k].append(ms / mg)
                row = f"| {size} | {g} | {L} | {k} | {ms:.3f} | {mg:.3f} | {ms / mg:.2f}x |"
                if tt:
                    mt = statistics.median(tt)
                    vs_trl[k].append(k * mt / mg)
                    row += f" {mt:.3f} | {k * mt / mg:.2f}x |"
                print(row, flush=True)
    for k in ks:
        line = f"K={k}: gang / solo run-steps per second {_span(ratios[k])}"
        if vs_trl[k]:
            line += f"; gang / TRL {_span(vs_trl[k])}"
        print(line)


def run_levers(a) -> None:
    """Each lever's effect on the built-in step: variants interleaved step by step."""
    import torch

    from race.engines import sampling

    def multinomial(logits, temperature, generator=None, u=None):  # the sampler before the inverse-CDF draw
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    variants = {"all levers": ({}, None), "no LoRA merge": ({"merge": False}, None),
                "HF log-prob forward": ({"fast_forward": False}, None), "multinomial sampler": ({}, multinomial),
                "none of the three": ({"merge": False, "fast_forward": False}, multinomial)}
    print("| model | G | completion | " + " | ".join(f"{v} s/step" for v in variants) +
          " | merge gain | functional-forward gain | sampler gain | all three |")
    print("|---|---|---|" + "---|" * (len(variants) + 4))
    gains: dict[str, list[float]] = {"merge": [], "forward": [], "sampler": [], "all": []}
    real_draw = sampling.draw

    def patched(fn, draw):
        def step():
            sampling.draw = draw or real_draw
            try:
                return fn()
            finally:
                sampling.draw = real_draw
        return step

    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        for size, mdir, g, L in grid_points(a, root):
            steps = {k: patched(builtin_engine(mdir, a.prompts, g, L, root, **kw), draw)
                     for k, (kw, draw) in variants.items()}
            times: dict[str, list[float]] = {k: [] for k in variants}
            for fn in steps.values():
                fn()
            for _ in range(a.rounds * a.steps):
                for k, fn in steps.items():
                    times[k].append(fn()[0])
            m = {k: statistics.median(v) for k, v in times.items()}
            row = {k: m[v] / m["all levers"] for k, v in (("merge", "no LoRA merge"),
                                                               ("forward", "HF log-prob forward"),
                                                               ("sampler", "multinomial sampler"),
                                                               ("all", "none of the three"))}
            for k, v in row.items():
                gains[k].append(v)
            print(f"| {size} | {g} | {L} | " + " | ".join(f"{m[k]:.3f}" for k in variants) + " | " +
                  " | ".join(f"{v:.2f}x" for v in row.values()) + " |", flush=True)
    print(f"\nstep speed-up from the LoRA merge {_span(gains['merge'])}, from the functional log-prob forward "
          f"{_span(gains['forward'])}, from the sampler {_span(gains['sampler'])}, all three {_span(gains['all'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny-xs,tiny-s,tiny-m,tiny-l",
                    help="tiny sizes, or smollm2-135m (the imported SmolLM2-135M-Instruct: real weights, so its "
                         "completions end where the model says EOS; --smollm2 sets its grid)")
    ap.add_argument("--groups", default="4,8,16")
    ap.add_argument("--lengths", default="16,32,64")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smollm2", action="store_true",
                    help="SmolLM2-135M-Instruct x G=4,8 x completion 24,64 (race base import smollm2 first)")
    ap.add_argument("--quick", action="store_true", help="a small subset: tiny-s,tiny-m x G=8 x completion 32")
    ap.add_argument("--levers", action="store_true",
                    help="instead of TRL: the built-in step with each speed lever switched off, interleaved")
    ap.add_argument("--gang", default="", help="gang sizes K (e.g. 2,4,8): a gang of K against K solo runs")
    ap.add_argument("--no-trl-default", action="store_true", help="skip the TRL-defaults (checkpointing) column")
    ap.add_argument("--no-trl", action="store_true", help="with --gang: time gangs against solo runs only")
    a = ap.parse_args()
    if a.quick:
        a.sizes, a.groups, a.lengths = "tiny-s,tiny-m", "8", "32"
    if a.smollm2:
        a.sizes, a.groups, a.lengths = "smollm2-135m", "4,8", "24,64"
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from engine_profile import matmul_peak

    import transformers

    transformers.utils.logging.disable_progress_bar()  # no model-loading bars between the rows
    torch.set_num_threads(a.threads)
    print(f"$ {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"torch {torch.__version__}, {a.threads} thread(s), {a.prompts} prompts/step, medians of "
          f"{a.rounds} rounds x {a.steps} steps (interleaved blocks), load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs\n")
    peaks = {}
    for size in a.sizes.split(","):
        h, f = mlp_shape(size)
        peaks[size] = matmul_peak(2048, h, f)
        print(f"one-thread matmul peak at {size}'s MLP shape (2048x{h})@({h}x{f}): {peaks[size] / 1e9:.1f} GFLOP/s")
    print()
    if a.gang:
        run_gangs(a)
    elif a.levers:
        run_levers(a)
    else:
        run_grid(a)


if __name__ == "__main__":
    main()
