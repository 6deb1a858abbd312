"""`race flops` and `race plan`: the FLOP arithmetic of a GRPO step and of the allocations that
fit a budget, before anything runs. Each command is a few lines over a library call; heavy
imports happen inside the commands so they start fast."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from race.accounting import AccountingError
from race.cli.ui import fail as _fail
from race.cli.ui import one_line


def _console():
    from rich.console import Console

    return Console()


def _yaml_defaults(path: Optional[Path]) -> dict:
    if path is None:
        return {}
    from race.spec.errors import ConfigError, load_yaml_mapping

    try:
        return load_yaml_mapping(path, ConfigError, "settings file")
    except ConfigError as e:
        _fail(str(e))
    return {}


def flops(
    model: Annotated[Optional[str], typer.Option(help="Qwen2.5 preset, tiny-family name, config.json, model dir or hub name in the local HF cache")] = None,
    lora_rank: Annotated[Optional[int], typer.Option(help="LoRA rank (omit for full fine-tuning)")] = None,
    prompts: Annotated[Optional[int], typer.Option(help="prompts per step")] = None,
    group: Annotated[Optional[int], typer.Option(help="group size G (num_generations)")] = None,
    prompt_len: Annotated[Optional[int], typer.Option(help="prompt tokens")] = None,
    completion_len: Annotated[Optional[int], typer.Option(help="completion tokens")] = None,
    iterations: Annotated[Optional[int], typer.Option(help="policy-update passes per batch (num_iterations)")] = None,
    update_generations: Annotated[Optional[int], typer.Option(help="rollouts per prompt the update trains on "
                                                                   "(num_update_generations, PODS's m <= G; "
                                                                   "default all G)")] = None,
    beta: Annotated[Optional[float], typer.Option(help="KL coefficient; != 0 adds reference log-probs")] = None,
    reward: Annotated[Optional[str], typer.Option(help="rule | random | orm:MODEL | prm:MODEL | judge:MODEL")] = None,
    conventions: Annotated[Optional[str], typer.Option(help="race | torch | verl | verl-legacy | megatron | palm | 6nd")] = None,
    share_prompt: Annotated[bool, typer.Option(help="prefill each prompt once for its G samples")] = False,
    recompute: Annotated[bool, typer.Option(help="gradient checkpointing (recompute as hardware FLOPs)")] = False,
    steps: Annotated[Optional[int], typer.Option(help="whole-run totals for this many steps")] = None,
    budget: Annotated[Optional[float], typer.Option(help="whole-run totals for the steps this budget buys")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML file with these settings")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Per-phase FLOPs of one GRPO step and of a whole run, with percentages."""
    from race.estimate import flops_report
    from race.spec.errors import ConfigError
    from race.spec.flops import flops_query

    data = _yaml_defaults(config)
    flags = dict(model=model, lora_rank=lora_rank, prompts=prompts, group=group, prompt_len=prompt_len,
                 completion_len=completion_len, iterations=iterations, update_generations=update_generations,
                 beta=beta, reward=reward,
                 conventions=conventions, steps=steps, budget=budget,
                 share_prompt=True if share_prompt else None, recompute=True if recompute else None)
    if not (model or data.get("model")):
        _fail("--model is required (a preset such as qwen2.5-7b, a tiny-family name, or a config.json path)")
    try:
        query = flops_query(data, str(config) if config else "flags",
                            {k: v for k, v in flags.items() if v is not None})
        rep = flops_report(query)
    except (AccountingError, ConfigError, ValueError) as e:
        _fail(one_line(str(e)))
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
        return
    _print_flops(rep)


def _print_flops(rep: dict) -> None:
    from rich.table import Table

    from race.cards import fmt_flops
    from race.cli.tables import print_table

    c = _console()
    t = Table(title=f"GRPO step: {rep['model']} ({rep['params'] / 1e9:.3g}B params), "
                    f"{rep['prompts']} prompts x G={rep['num_generations']}"
                    + (f" (update on {rep['num_update_generations']})"
                       if rep["num_update_generations"] != rep["num_generations"] else "") + ", "
                    f"{rep['prompt_len']}+{rep['completion_len']} tokens")
    t.add_column("phase")
    t.add_column("FLOPs / step", justify="right")
    t.add_column("share", justify="right")
    if "run" in rep:
        t.add_column(f"FLOPs / run ({rep['steps']} steps)", justify="right")
    total = rep["step"]["total"] or 1
    from race.accounting import PHASES

    for ph in (*PHASES, "total", "recompute"):
        v = rep["step"][ph]
        share = f"{v / total:.1%}" if ph != "recompute" else "(hardware)"
        row = [ph, fmt_flops(v), share]
        if "run" in rep:
            row.append(fmt_flops(rep["run"][ph]))
        t.add_row(*row, style="bold" if ph == "total" else None)
    print_table(c, t)
    s = rep["shares"]
    c.print(f"split: search {s['search']:.1%}, learning {s['learning']:.1%}, feedback {s['feedback']:.1%}; "
            f"update share p {rep['p']:.3f}, p_policy {rep['p_policy']:.3f}")
    c.print(f"[dim]{rep['conventions_text']}[/dim]")


def plan(
    budget: Annotated[float, typer.Option(help="FLOP budget of the run")],
    models: Annotated[str, typer.Option(help="comma-separated models")] = "qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b",
    groups: Annotated[str, typer.Option(help="comma-separated group sizes")] = "4,8,16",
    rewards: Annotated[str, typer.Option(help="comma-separated reward systems")] = "rule,prm:qwen2.5-math-prm-7b",
    prompts: Annotated[int, typer.Option(help="prompts per step: at the largest group (--hold sequences) or at "
                                              "every group (--hold prompts)")] = 32,
    hold: Annotated[str, typer.Option(help="what stays fixed across group sizes: sequences (prompts x G; a "
                                           "larger G means fewer prompts) or prompts (a larger G costs more)")
                    ] = "sequences",
    prompt_len: Annotated[int, typer.Option()] = 256,
    completion_len: Annotated[int, typer.Option()] = 512,
    lora_rank: Annotated[Optional[int], typer.Option()] = 64,
    iterations: Annotated[str, typer.Option(help="comma-separated policy-update passes per batch "
                                                 "(num_iterations)")] = "1",
    steps_per_generation: Annotated[str, typer.Option(help="comma-separated optimizer steps per generation batch "
                                                           "(TRL's steps_per_generation at one micro-batch per "
                                                           "optimizer step)")] = "1",
    update_generations: Annotated[str, typer.Option(help="comma-separated rollouts per prompt the update trains "
                                                         "on (num_update_generations, PODS's m; 'all' = G): "
                                                         "fewer lower the update share p at equal FLOPs")
                                  ] = "all",
    beta: Annotated[float, typer.Option(help="KL coefficient; != 0 adds reference log-probs")] = 0.0,
    conventions: Annotated[str, typer.Option()] = "race",
    device: Annotated[Optional[str], typer.Option(help="also price each run's wall time and GPU-hours on this "
                                                       "device: h100 | h200 | a100 | l40s | cpu")] = None,
    mfu: Annotated[Optional[str], typer.Option(help="with --device: model-FLOP utilisation, one fraction or "
                                                    "rollout=0.02,learning=0.15,feedback=0.15 (default: measured "
                                                    "in --study-dir, else the stated assumption)")] = None,
    study_dir: Annotated[Optional[Path], typer.Option(help="with --device: measure the MFU on this study's "
                                                           "finished runs")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Allocations (model x group size x reward x iterations x steps per generation x update
    generations) that fit a budget: prompts and sequences per step, the steps each buys and
    its split (the update share p moves with the last three at equal FLOPs: more passes or
    optimizer steps raise it, training on m of a prompt's G rollouts lowers it); rows that
    cannot afford one step are named. With --device, each run's wall time and GPU-hours on
    that device."""
    from race.accounting import allocations

    _check_plan_flags(budget, lora_rank, hold, beta, prompts, prompt_len, completion_len)
    price = _pricing(device, mfu, study_dir)
    gs = _whole_numbers("--groups", groups, 2, "GRPO needs group sizes >= 2")
    its = _whole_numbers("--iterations", iterations, 1, "must be >= 1")
    spgs = _whole_numbers("--steps-per-generation", steps_per_generation, 1, "must be >= 1")
    ms = _update_generations(update_generations, gs)
    skipped: list = []
    try:
        plans = _step_plans(models, rewards, gs, its, spgs, ms, lora_rank, beta, conventions)
        allocs = allocations(budget, plans, prompts_per_step=prompts, prompt_len=prompt_len,
                             completion_len=completion_len, group_tokens_fixed=hold == "sequences",
                             unaffordable=skipped)
    except (AccountingError, ValueError) as e:
        _fail(one_line(str(e)))
    _show_plan(budget, allocs, skipped, hold, prompts, max(gs), price, lora_rank, completion_len, as_json)


def _show_plan(budget: float, allocs: list, skipped: list, hold: str, prompts: int, gmax: int, price,
               lora_rank: Optional[int], completion_len: int, as_json: bool) -> None:
    """``race plan``'s output: the allocations (JSON or a table) with each run's time on the
    device when priced; none affordable ends the command naming the cheapest step."""
    if not allocs:
        cheapest = min(a.step.total for a in skipped)
        _fail(f"no allocation affords one step within {budget:.3g} FLOPs (the cheapest step costs {cheapest:.3g}); "
              "raise --budget or shrink the step")
    times = [_run_time(price, a, lora_rank, completion_len) for a in allocs] if price else None
    if as_json:
        typer.echo(json.dumps([{**a.row(), **(times[i] if times else {})} for i, a in enumerate(allocs)], indent=2))
        return
    _print_plan(budget, allocs, skipped, hold, prompts, gmax, times)
    if price is not None:
        _console().print(f"[dim]{price.describe()}[/dim]", highlight=False)


def _step_plans(models: str, rewards: str, gs: list[int], its: list[int], spgs: list[int], ms: list[int | None],
                lora_rank: Optional[int], beta: float, conventions: str) -> list:
    """``race plan``'s step plans: every model x group size x reward x iterations x optimizer
    steps per generation x update generations (m <= G; None: all G), as StepPlans."""
    from race.accounting import LoRA, StepPlan
    from race.models.refs import resolve_shape
    from race.rewards.systems import reward_system

    shapes = [resolve_shape(m.strip()) for m in models.split(",") if m.strip()]
    rws = [reward_system(r.strip()) for r in rewards.split(",") if r.strip()]
    lora = LoRA(lora_rank) if lora_rank else None
    return [StepPlan(shape, g, lora=lora, num_iterations=it, optimizer_steps=k, beta=beta, reward=rw,
                     conventions=conventions, update_generations=m if m != g else None)
            for shape in shapes for g in gs for rw in rws for it in its for k in spgs
            for m in dict.fromkeys(g if m is None else m for m in ms) if m <= g]


def _pricing(device: Optional[str], mfu: Optional[str], study_dir: Optional[Path]):
    """``race.grid.pricing`` for ``--device`` (None without it); a bad device or MFU ends the command."""
    if device is None:
        if mfu is not None or study_dir is not None:
            _fail("--mfu and --study-dir price the runs on a device: add --device h100 (or h200, a100, l40s, cpu)")
        return None
    from race.grid.pricing import pricing

    try:
        return pricing(device, mfu=mfu, study_dir=study_dir)
    except AccountingError as e:
        _fail(f"--device {device}: {e}")
    except ValueError as e:
        _fail(str(e))


def _run_time(price, a, lora_rank: Optional[int], completion_len: int) -> dict:
    """Wall seconds and device-hours of the run allocation ``a`` buys, on ``price``'s device."""
    from race.accounting import split_sums

    per_step = split_sums(a.step.as_dict())
    flops = {"rollout": per_step["search"] * a.steps, "learning": per_step["learning"] * a.steps,
             "feedback": per_step["feedback"] * a.steps}
    secs = price.run_seconds(a.steps, flops, dtype="bf16" if lora_rank else "fp32", completion_len=completion_len)
    return {"device": price.device.key, "wall_s": secs, "device_hours": price.hours(secs)}


def _check_plan_flags(budget: float, lora_rank: Optional[int], hold: str, beta: float, prompts: int, prompt_len: int,
                      completion_len: int) -> None:
    """``race plan``'s scalar flags (``_fail`` says what to write)."""
    from race.accounting.guard import is_budget
    from race.spec.flops import MAX_TOKENS

    if not is_budget(budget):
        _fail(f"--budget {budget:g}: budget must be > 0 and finite (a FLOP count)")
    if lora_rank is not None and lora_rank < 1:
        _fail(f"--lora-rank {lora_rank}: must be >= 1 (omit it for full fine-tuning)")
    if hold not in ("sequences", "prompts"):
        _fail(f"--hold {hold!r}: choose sequences or prompts")
    if not math.isfinite(beta) or beta < 0:
        _fail(f"--beta {beta:g}: must be >= 0 and finite")
    for flag, value, top in (("--prompts", prompts, None), ("--prompt-len", prompt_len, MAX_TOKENS),
                             ("--completion-len", completion_len, MAX_TOKENS)):
        if value < 1:
            _fail(f"{flag} {value}: must be >= 1")
        if top is not None and value > top:
            _fail(f"{flag} {value}: must be <= {top}")


def _update_generations(text: str, groups: list[int]) -> list[Optional[int]]:
    """``--update-generations``: whole numbers >= 2 or ``all`` (None: every rollout), at
    least one no larger than the largest group (``_fail`` says what to write)."""
    vals: list[Optional[int]] = []
    for v in (t.strip() for t in text.split(",") if t.strip()):
        if v == "all":
            vals.append(None)
            continue
        try:
            vals.append(int(v))
        except ValueError:
            _fail(f"--update-generations {text!r}: give comma-separated whole numbers or 'all', e.g. 8,4,2")
    if not vals or any(v is not None and v < 2 for v in vals):
        _fail(f"--update-generations {text}: the update trains on 2 or more rollouts per prompt (or 'all')")
    if all(v is not None and v > max(groups) for v in vals):
        _fail(f"--update-generations {text}: every value exceeds the largest group {max(groups)}; the update "
              "trains on at most G rollouts per prompt")
    return vals


def _whole_numbers(flag: str, text: str, least: int, why: str) -> list[int]:
    """A comma-separated list of whole numbers >= ``least`` (``_fail`` says what to write)."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        _fail(f"{flag} {text!r}: give comma-separated whole numbers, e.g. 4,8,16")
    if not vals or any(v < least for v in vals):
        _fail(f"{flag} {text}: {why}")
    return vals


def _print_plan(budget: float, allocs: list, skipped: list, hold: str, prompts: int, gmax: int,
                times: Optional[list] = None) -> None:
    from rich.table import Table

    from race.cards import fmt_flops
    from race.accounting import SPLIT
    from race.cli.tables import fmt_seconds, print_table

    held = (f"sequences per step held at {prompts * gmax} ({prompts} prompts x G={gmax}): a larger G means fewer "
            "prompts, so FLOPs per step barely change with G" if hold == "sequences"
            else f"prompts per step held at {prompts}: a larger G means more sequences and a dearer step")
    cells = [a.row() for a in allocs]
    knobs = any((r["num_iterations"], r["steps_per_generation"]) != (1, 1) for r in cells)  # shown when asked for
    sub = any(r["num_update_generations"] != r["num_generations"] for r in cells)
    t = Table(title=f"Allocations within {fmt_flops(budget)} (sorted by steps bought)",
              caption=f"{held}; " + ("it = num_iterations, spg = optimizer steps per generation (a step is one "
                                     "generation); " if knobs else "")
              + ("m = rollouts per prompt the update trains on (num_update_generations) of the G generated; "
                 if sub else "")
              + "split = % of FLOPs in search (rollout), learning (the update share p), feedback (reward)"
              + ("; p = learning / all, p_pol = learning / (search + learning)" if knobs or sub else ""))
    unit = "GPU-h" if times and times[0]["device"] != "cpu" else "worker-h"
    cols = ("model", "G", *(("m",) if sub else ()), "reward", *(("it", "spg") if knobs else ()), "prompts", "seqs",
            "FLOPs/step", "steps", *(("opt steps",) if knobs else ()), "split % S L F",
            *(("p", "p_pol") if knobs or sub else ()),
            *((f"wall ({times[0]['device']})", unit) if times else ()))
    for col in cols:
        t.add_column(col, justify="right" if col not in ("model", "reward") else "left")
    for i, r in enumerate(cells):
        split = " ".join(f"{100 * float(r[k]):.0f}" for k in SPLIT)  # type: ignore[arg-type]
        knob = (str(r["num_iterations"]), str(r["steps_per_generation"])) if knobs else ()
        when = (fmt_seconds(times[i]["wall_s"]), f"{times[i]['device_hours']:.3g}") if times else ()
        t.add_row(str(r["model"]), str(r["num_generations"]), *((str(r["num_update_generations"]),) if sub else ()),
                  str(r["reward"]), *knob, str(r["prompts"]),
                  str(r["sequences"]), fmt_flops(r["step_flops"]), str(r["steps"]),
                  *((str(r["optimizer_steps"]),) if knobs else ()), split,
                  *((f"{r['p']:.2f}", f"{r['p_policy']:.2f}") if knobs or sub else ()), *when)
    c = _console()
    print_table(c, t)
    by: dict[tuple[str, str], list] = {}
    for a in skipped:
        by.setdefault((a.model, a.reward), []).append(a)
    for (model, reward), rows in by.items():
        gs = ",".join(str(a.num_generations) for a in rows)
        cheapest = min(a.step.total for a in rows)
        c.print(f"not affordable: {model} G={gs} with {reward}: one step costs >= {fmt_flops(cheapest)}, more than "
                f"the budget {fmt_flops(budget)}", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``flops`` and ``plan`` to the main app."""
    app.command()(flops)
    app.command()(plan)


__all__ = ["flops", "plan", "register"]
