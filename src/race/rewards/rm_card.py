"""What a study's learned reward says about itself: quality and cost of the reward model
behind a reward spec, read from its ``info.json`` (torch-free, nothing built or copied).

    rm_card("prm", "prm-m") -> {"name": "prm-m", "step_auc": 0.929, ...} | None

Which model a reward names is ``race.rewards.rm_recipes.learned_target``'s rule (a path
first, even one named like a recipe; then RACE's recipes, whose kind must match). Where
the info comes from, in order: the RACE cache (``<cache>/rm/<name>-<hash>/``, the
RM's CURRENT recipe hash), else the copy the package ships under the same hash; for a
local directory (``prm:/path``), its own ``info.json`` when it has one. The reward is given
by its typed columns (``race.schema.REWARD_COLUMNS``: ``reward_system``, ``reward_model``),
never re-parsed from its string. ``None`` for a reward without a learned model (rules, the
random control); a learned reward whose info
cannot be found gets ``found: False`` and a ``note`` saying what to run.

Quality (``step_auc``, ``bad_step_recall``, ``good_step_recall``, ``outcome_auc``,
``threshold``): the held-out policy samples of :mod:`race.builds.rm_eval` when the build
recorded them (``info.json["data"]["heldout"]``, ``quality_on: "policy samples"``), else the
build's own test mixture of programmatic corruptions at threshold 0.5 (``info.json["eval"]``,
``quality_on: "programmatic test mixture"``): the two are not the same yardstick and the
report says which it shows.

Cost (FLOPs, ``race`` conventions as recorded): ``train_flops`` (forward + backward of a
classifier's training; a likelihood PRM's calibration forwards), ``sampling_flops``
(generating its training pool of policy samples; ``pool_digest`` names the pool, which
several RMs may share), ``training_flops`` = the two together, the RM's training;
``base_sft_flops`` (the warm start's SFT a likelihood PRM is read off: shared with the
policy warm start of that size, reported, never counted); ``flops_per_token`` (inference,
averaged over the held-out batches).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from race.artefacts.cache import INFO_FILE, PACKAGED, cache_root

POLICY_SAMPLES = "policy samples"
PROGRAMMATIC = "programmatic test mixture"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_info(name: str, *, cache_dir: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """``(info.json, where)`` of RACE's RM ``name`` at its current recipe hash: the cache's
    copy, else the packaged one (``where``: ``cache`` / ``packaged``); ``(None, why)`` when
    neither holds it."""
    from race.rewards.rm_recipes import recipe_hash

    dirname = f"{name}-{recipe_hash(name)}"
    for where, root in (("cache", cache_root(cache_dir) / "rm"), ("packaged", PACKAGED / "rm")):
        info = _read(root / dirname)
        if info is not None:
            return info, where
    return None, f"not built (no {dirname} in the cache or the package): run `race rm build --names {name}`"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def summarise_info(info: dict[str, Any]) -> dict[str, Any]:
    """Quality and cost of one RM from its ``info.json`` (module docstring)."""
    data = info.get("data") or {}
    held = data.get("heldout") or {}
    ev = info.get("eval") or {}
    origin = info.get("origin") or {}
    q, on = (held, POLICY_SAMPLES) if held.get("step_auc") is not None or held.get("outcome_auc") is not None \
        else (ev, PROGRAMMATIC)
    detail = (f"{held.get('heldout_problems', 'held-out problems')}, {held.get('n_samples', '?')} completions of "
              f"{', '.join(held.get('policies') or []) or 'the policies'}" if on == POLICY_SAMPLES else
              f"{ev.get('n_eval', '?')} corrupted/reference solutions of the test split, threshold 0.5")
    train = int(info.get("train_flops") or 0)
    sampling = int(data.get("sampling_flops") or 0)
    return dict(name=info.get("name", ""), kind=info.get("kind", ""), recipe_hash=info.get("recipe_hash", ""),
                params=int(info.get("total_params") or 0),
                step_auc=_num(q.get("step_auc")), bad_step_recall=_num(q.get("bad_step_recall")),
                good_step_recall=_num(q.get("good_step_recall")), outcome_auc=_num(q.get("outcome_auc")),
                threshold=_num(q.get("threshold")) if on == POLICY_SAMPLES else 0.5,
                quality_on=on, quality_detail=detail,
                flops_per_token=_num(held.get("flops_per_token")),
                train_flops=train, sampling_flops=sampling, training_flops=train + sampling,
                base_sft_flops=int(origin.get("base_sft_flops") or 0), pool_digest=str(data.get("pool_digest") or ""),
                conventions=info.get("flops_conventions", ""))


def rm_card(kind: str, model: str | None, *, cache_dir: str | os.PathLike[str] | None = None
            ) -> dict[str, Any] | None:
    """Quality and cost of the learned model behind a reward of system ``kind`` (its
    ``reward_system``) whose model is ``model`` (its ``reward_model``: ``prm-m``, a path), or
    ``None`` when the reward has none (module docstring)."""
    from race.accounting.reward_kinds import REWARD_KINDS

    row = REWARD_KINDS.get(kind)
    if row is None or not row.model:
        return None
    if not row.classifier:  # a generative model kind (the judge)
        return dict(name=model, kind=kind, found=False, note=f"a generative {kind} records no quality")
    target = str(model or "")
    from race.rewards.rm_recipes import learned_target

    try:
        source = learned_target(kind, target).source
    except ValueError as e:  # a RACE RM of the other kind: no run could have loaded it
        return dict(name=target, kind=kind, found=False, note=str(e))
    if source == "recipe":
        info, where = find_info(target, cache_dir=cache_dir)
    elif source == "path":
        path = Path(target).expanduser()
        info, where = _read(path), "path"
        if info is None:
            return dict(name=path.name, kind=kind, found=False,
                        note=f"{path} has no {INFO_FILE}: its quality and training cost are unknown to RACE")
    else:
        return dict(name=target, kind=kind, found=False, note=f"{target!r} is no RM RACE builds")
    if info is None:
        return dict(name=target, kind=kind, found=False, note=where)
    return dict(summarise_info(info), name=target if where != "path" else info.get("name") or target,
                found=True, source=where)


__all__ = ["rm_card", "find_info", "summarise_info", "POLICY_SAMPLES", "PROGRAMMATIC"]
