"""Would a worker be able to run this cell? Checked for every cell at plan time (torch-free).

:func:`cell_check` resolves what a cell reads before it spends anything, the way the worker
will: its data files (``task.path``, ``train_path``, ``test_path``, ``hard_path``, read from
the current directory as the worker reads them), its policy and the tokenizer's chat
template when ``task.chat_template`` asks for one (:func:`race.models.preflight.policy_check`),
its reward model (a RACE recipe is built on demand; a folder must hold a loadable model; a
judge loads like a policy) and the settings its engine refuses (``race.engines.checks``).
A cell that would fail is refused with the reason; ``race grid plan`` exits non-zero when
any is. Models and reward models are checked only for RACE's own cell function: a custom
``cell_fn`` reads its cells' settings its own way.
"""

from __future__ import annotations

from pathlib import Path

from race.engines.checks import engine_refusal
from race.spec.run import RunConfig


def data_refusal(cfg: RunConfig) -> str | None:
    """The first data path of the cell's task that is not there, said with what to change."""
    for setting, path in cfg.task.data_paths().items():
        if not Path(path).expanduser().exists():
            where = "" if Path(path).expanduser().is_absolute() else f" (relative to {Path.cwd()})"
            return (f"task.{setting} {path!r}: file not found{where}; fix the path in the grid file or run from "
                    "the folder it is relative to")
    return None


def reward_check(cfg: RunConfig) -> tuple[str | None, list[str]]:
    """Whether the cell's reward can be built: a rule costs nothing to check; a RACE reward
    model is built on demand; a reward-model folder must hold a model; a hub name is not
    loaded as a reward model (``race.rewards.learned``); a judge loads like a policy."""
    from race.accounting.errors import did_you_mean
    from race.models.preflight import folder_problem, policy_check
    from race.rewards.rm_recipes import known_rms
    from race.rewards.systems import resolve_reward

    try:
        resolved = resolve_reward(cfg.reward)
    except ValueError as e:
        return f"reward {cfg.reward}: {e}", []
    spec, target = resolved.spec, resolved.target
    if not resolved.kind.model:
        return None, []
    if target is None:  # a generative judge: loaded as a causal LM, like the policy
        check = policy_check(spec.target)
        return (f"reward {spec}: {check.problem}" if check.problem else None), check.notes
    if target.source == "recipe":
        return None, []
    if target.source == "path":
        p = Path(target.ref).expanduser()
        if not p.exists():
            where = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
            return f"reward {spec}: reward-model folder {target.ref!r} not found{where}", []
        return (f"reward {spec}: " + problem if (problem := folder_problem(p, chat_template=False,
                                                                         what="reward-model")) else None), []
    same = [n for n in known_rms() if n.startswith(spec.kind)]
    return (f"reward {spec}: unknown reward model {spec.target!r}{did_you_mean(spec.target, same)}; RACE builds "
            f"{', '.join(same)}, or give a local folder ({spec.kind}:./path/to/model)"), []


def cell_check(cfg: RunConfig, *, models: bool = True) -> tuple[str | None, list[str]]:
    """``(refusal, notes)`` for one cell (module docstring): every reason a worker would fail
    on it (joined), or None, and what the plan should say about it otherwise (a model the
    first cell downloads). ``models``: check the policy and reward model (RACE's cell function)."""
    problems = [data_refusal(cfg)]
    notes: list[str] = []
    if models:
        from race.models.preflight import policy_check

        check = policy_check(cfg.model, chat_template=cfg.task.chat_template)
        reward, more = reward_check(cfg)
        problems += [check.problem, reward]
        notes += check.notes + more
    problems.append(engine_refusal(cfg))
    found = [p for p in problems if p]
    return ("; and ".join(found) if found else None), notes


def cell_refusal(cfg: RunConfig, *, models: bool = True) -> str | None:
    """Why a worker would refuse ``cfg`` before spending anything, or None (:func:`cell_check`)."""
    return cell_check(cfg, models=models)[0]


__all__ = ["cell_check", "cell_refusal", "data_refusal", "reward_check"]
