"""``race rm``: build and inspect the reward models RACE trains itself.

``race rm build`` trains the requested reward models on the built-in task (or reuses the
checkpoints cached under ``<cache>/rm/``) and prints one row per model: its training
FLOPs (kept apart from any run's budget) and its step-level and outcome accuracy on the
recipe's programmatic test mixture. ``race rm eval`` scores every packaged RM on held-out
POLICY samples (``race.builds.rm_eval``: step AUC, bad-step recall at the threshold
chosen on a validation set) beside its inference FLOPs per token and its build FLOPs.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

app = typer.Typer(help="Reward models RACE trains itself (process and outcome RMs).", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Reward models RACE trains itself (``race rm build``)."""


def _parse_names(names: str | None) -> list[str]:
    from race.rewards.rm_recipes import known_rms

    if not names:
        return known_rms()
    out = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in out if n not in known_rms()]
    if unknown:
        raise typer.BadParameter(f"unknown reward model(s) {unknown}; choose from {', '.join(known_rms())}",
                                 param_hint="--names")
    return out


@app.command("build")
def build(
    names: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. prm-xs,prm-s,orm-s (default: all)")
                     ] = None,
    force: Annotated[bool, typer.Option("--force", help="retrain even when a cached checkpoint exists")] = False,
    cache_dir: Annotated[Optional[str], typer.Option(help="cache root (default $RACE_CACHE or ~/.cache/race)")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads (default: torch's choice)")] = None,
) -> None:
    """Train the reward models (or reuse cached ones) and report their held-out accuracy."""
    from rich.console import Console
    from rich.table import Table

    from race.cards import fmt_flops
    from race.cli.tables import print_table
    from race.cli.ui import build_with_bars
    from race.builds import rm_training
    from race.rewards.rm_recipes import recipe_for

    chosen = _parse_names(names)
    console = Console()
    infos = build_with_bars(console, [
        (name, recipe_for(name).steps,
         lambda cb, name=name: rm_training.build_rm(name, cache_dir=cache_dir, force=force, progress=cb))
        for name in chosen], threads=threads)

    table = Table(title="reward models (held-out test split; accuracy at threshold 0.5, AUC = ranking quality)")
    cols = ("name", "kind", "backbone", "params", "steps", "seconds", "train FLOPs", "step acc", "bad-step recall",
            "step AUC", "outcome acc", "outcome AUC", "source")
    for col in cols:
        table.add_column(col, justify="left" if col in ("name", "kind", "backbone", "source") else "right")

    def num(ev: dict, key: str) -> str:
        return f"{ev[key]:.3f}" if key in ev else "-"

    for info in infos:
        ev = info.eval
        table.add_row(info.name, info.kind, str(info.recipe["backbone"]), f"{info.total_params:,}", str(info.steps),
                      f"{info.seconds:.0f}", fmt_flops(info.train_flops), num(ev, "step_accuracy"),
                      num(ev, "bad_step_recall"), num(ev, "step_auc"), num(ev, "outcome_accuracy"),
                      num(ev, "outcome_auc"), "cached" if info.reused else "built")
    print_table(console, table)
    console.print("  training FLOPs: race conventions, full fine-tuning, head at the scored positions; "
                  "not charged to any run's budget. Step metrics: ';' markers; outcome: PRM min over markers "
                  "(0 if unfinished) / ORM score vs final-answer correctness.")
    for info in infos:
        console.print(f"  {info.name}: {info.path}")


@app.command("eval")
def eval_(
    names: Annotated[Optional[str], typer.Option(help="comma-separated (default: every packaged or cached RM)")
                     ] = None,
    cache_dir: Annotated[Optional[str], typer.Option(help="cache root (default $RACE_CACHE or ~/.cache/race)")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads (default: torch's choice)")] = None,
) -> None:
    """Quality of the reward models on held-out policy samples (race.builds.rm_eval):
    step AUC, bad-step recall at the threshold chosen on the validation set, costs."""
    from rich.console import Console

    from race.cli.tables import print_table
    from race.builds.rm_report import quality_rows

    if threads:
        import torch

        torch.set_num_threads(threads)
    console = Console()
    rows = quality_rows(_parse_names(names) if names else None, cache_dir=cache_dir)
    print_table(console, _quality_table(rows))
    by = [r for r in rows if r["heldout"].get("by_group")]
    if by:
        print_table(console, _by_policy_table(by))
    console.print("  held-out: one sample per problem from each of " + ", ".join(rows[0]["heldout"]["policies"])
                  + " at temperature 1 on test-split problems; the threshold (flag a step when p(ok) < t) "
                  "maximises Youden's J on a validation set of train-split problems outside the RM's pool. "
                  "FLOPs/token: what the RM reward charges per token it reads (race conventions). train FLOPs: the "
                  "RM's own training (classifier: forward+backward per step; likelihood PRM: the calibration "
                  "forwards); base SFT FLOPs: its warm start's training; sampling FLOPs: drawing its training "
                  "pool. None of them is charged to a run's budget. For ORMs the recall columns are wrong/right "
                  "outcomes." if rows else "  no reward model found")


def _quality_table(rows: list[dict]) -> Any:
    """``race rm eval``'s table: one row per reward model, its held-out quality and costs."""
    from rich.table import Table

    from race.cards import fmt_flops

    table = Table(title="reward models on held-out policy samples (test-split problems; threshold from validation)")
    cols = ("name", "kind", "backbone", "params", "step AUC", "bad-step recall", "good-step recall", "threshold",
            "outcome AUC", "FLOPs/token", "train FLOPs", "base SFT FLOPs", "sampling FLOPs", "all build FLOPs",
            "CPU s", "held-out")
    for col in cols:
        table.add_column(col, justify="left" if col in ("name", "kind", "backbone", "held-out") else "right")

    def num(v: object) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        q = r["heldout"]
        table.add_row(r["name"], r["kind"], r["backbone"], f"{r['params']:,}", num(q.get("step_auc")),
                      num(q.get("bad_step_recall", q.get("wrong_outcome_recall"))),
                      num(q.get("good_step_recall", q.get("right_outcome_recall"))), num(q.get("threshold")),
                      num(q.get("outcome_auc")), fmt_flops(q["flops_per_token"]), fmt_flops(r["train_flops"]),
                      fmt_flops(r["base_sft_flops"]) if r["base_sft_flops"] else "-",
                      fmt_flops(r["sampling_flops"]) if r["sampling_flops"] else "-",
                      fmt_flops(r["train_flops"] + r["base_sft_flops"] + r["sampling_flops"]),
                      "-" if r["cpu_seconds"] is None else f"{r['cpu_seconds']:.0f}",
                      f"{q['n_samples']} samples, {q.get('n_steps', '-')} steps")
    return table


def _by_policy_table(by: list[dict]) -> Any:
    """Step AUC / bad-step recall of each reward model by the policy that wrote the samples."""
    from rich.table import Table

    pols = list(by[0]["heldout"]["by_group"])
    sub = Table(title="step AUC / bad-step recall by the policy that wrote the held-out samples")
    sub.add_column("name")
    for pol in pols:
        sub.add_column(pol, justify="right")
    for r in by:
        g = r["heldout"]["by_group"]
        sub.add_row(r["name"], *(f"{g[p]['step_auc']:.3f} / {g[p]['bad_step_recall']:.3f}" if p in g else "-"
                                 for p in pols))
    return sub
