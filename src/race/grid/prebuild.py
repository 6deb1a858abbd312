"""Build the tiny base models and reward models a grid needs, several at once, before it runs.

The demo's first stage trains every warm start and RACE reward model it uses (cached
after the first run). On a small machine these small-matrix trainings scale poorly
across threads, so independent builds run side by side, one process each with
``cpu_count // workers`` torch threads, longest first. Reward models initialised from a
base model wait for the bases. A build is deterministic for its recipe, seed and thread
count (``info.json`` records the threads).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from race.spec.reward import RewardSpec


@dataclass(frozen=True)
class BuildJob:
    kind: str  # "base" | "rm"
    name: str
    recipe: Any  # SFTRecipe | RMRecipe
    cost: float  # relative, for longest-first ordering
    needs_base: bool = False  # an RM initialised from a base warm start


@dataclass(frozen=True)
class BuildDone:
    job: BuildJob
    seconds: float
    summary: str


def _base_cost(name: str, recipe: Any) -> float:
    """Relative wall time of a warm start: steps x (per-step overhead + matmul work); at
    this scale a step is mostly overhead (measured: tiny-xs 56 s, tiny-m 120 s for 500)."""
    from race.models.family import tiny_config_kwargs

    c = tiny_config_kwargs(name)
    steps = recipe.steps_for(name) if hasattr(recipe, "steps_for") else recipe.steps
    return float(steps * (1.0 + c["num_hidden_layers"] * c["hidden_size"] ** 2 / 20_000))


def grid_builds(models: Sequence[str], rewards: Sequence[RewardSpec]) -> tuple[list[str], list[str]]:
    """The tiny sizes and RACE reward models that a grid's model values and its cells'
    parsed reward specs (``RunConfig.reward``) need."""
    from race.models.family import is_tiny_name
    from race.rewards.systems import race_rms_of

    return [m for m in models if is_tiny_name(str(m))], race_rms_of(list(rewards))


def plan_builds(models: Sequence[str], rms: Sequence[str], *, cache_dir: str | os.PathLike[str] | None = None
                ) -> list[BuildJob]:
    """The builds still missing from the cache, longest first (bases before RMs that
    start from them)."""
    from race.models.base_recipes import cached_base, current_recipe
    from race.rewards.rm_recipes import read_info, recipe_for, rm_dir

    jobs: list[BuildJob] = []
    for m in dict.fromkeys(models):
        recipe = current_recipe()
        if cached_base(m, cache_dir=cache_dir, recipe=recipe) is None:
            jobs.append(BuildJob("base", m, recipe, _base_cost(m, recipe)))
    for r in dict.fromkeys(rms):
        recipe = recipe_for(r)
        if read_info(rm_dir(r, cache_dir=cache_dir, recipe=recipe)) is None:
            # longer sequences and a per-step scoring pass: ~2.2x a warm start's step (prm-xs: 103 s / 400)
            jobs.append(BuildJob("rm", r, recipe, 2.2 * _base_cost(recipe.backbone, recipe),
                                 needs_base=recipe.init == "base"))
    return sorted(jobs, key=lambda j: (j.needs_base, -j.cost))


def _run_job(job: BuildJob, cache_dir: str | None, threads: int) -> BuildDone:
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()  # the caller reports each build
    t0 = time.perf_counter()
    if job.kind == "base":
        from race.builds.warmstart import build_base

        info = build_base(job.name, cache_dir=cache_dir, recipe=job.recipe)
        summary = (f"{info.non_embedding_params:,} non-embedding params, greedy test accuracy "
                   f"{info.test_accuracy:.3f}")
    else:
        from race.builds.rm_training import build_rm

        rm = build_rm(job.name, cache_dir=cache_dir, recipe=job.recipe)
        ev = rm.eval or {}
        summary = ", ".join(f"{k} {ev[k]:.3f}" for k in ("step_accuracy", "outcome_accuracy") if k in ev) or "ready"
    return BuildDone(job, time.perf_counter() - t0, summary)


def run_builds(jobs: Sequence[BuildJob], *, cache_dir: str | os.PathLike[str] | None = None,
               workers: int | None = None, on_done: Callable[[BuildDone], None] | None = None) -> list[BuildDone]:
    """Run ``jobs``: in this process when there is one job or ``workers == 1``, else in
    ``workers`` spawned processes (default: min(jobs, CPUs)) with ``CPUs // workers``
    torch threads each. RMs that start from a base run after every base job."""
    jobs = list(jobs)
    if not jobs:
        return []
    cpus = os.cpu_count() or 1
    workers = max(1, min(workers or cpus, len(jobs)))
    cache = None if cache_dir is None else str(cache_dir)
    done: list[BuildDone] = []
    report = on_done or (lambda d: None)
    if workers == 1:
        import torch

        threads = torch.get_num_threads()
        for job in jobs:
            done.append(_run_job(job, cache, threads))
            report(done[-1])
        return done
    import multiprocessing as mp

    threads = max(1, cpus // workers)
    waiting = [j for j in jobs if j.needs_base]
    ready = [j for j in jobs if not j.needs_base]
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        running: dict[Future[BuildDone], BuildJob] = {}
        while ready or waiting or running:
            if not ready and waiting and not any(j.kind == "base" for j in running.values()):
                ready, waiting = waiting, []
            while ready and len(running) < workers:
                job = ready.pop(0)
                running[pool.submit(_run_job, job, cache, threads)] = job
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                running.pop(fut)
                done.append(fut.result())  # a failed build raises here, naming its error
                report(done[-1])
    return done


__all__ = ["BuildJob", "BuildDone", "grid_builds", "plan_builds", "run_builds"]
