"""RACE's own reward models by recipe: what each one is, its cache key, its shape, where a
built one lives and what its ``info.json`` holds.

Torch-free: ``race flops --reward prm:prm-s``, planning and the build planner read these
without building anything; a loader asks :func:`rm_path` (a missing RM raises
:class:`~race.artefacts.cache.NotBuiltError` naming ``race rm build``). Training lives in
:mod:`race.builds.rm_training`; the cache is :mod:`race.artefacts`
(``<cache>/rm/<name>-<recipe hash>/``).
"""

from __future__ import annotations

from race.accounting.reward_kinds import classifier_kinds, reward_kind

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.accounting import ModelShape
from race.artefacts.cache import ArtefactCache, NotBuiltError, recipe_digest
from race.artefacts.recipe import RecipeSchedule
from race.models.base_recipes import recipe_hash as base_hash
from race.models.family import tiny_config_kwargs
from race.models.tokenizer import ALPHABET, SPECIAL_TOKENS
from race.rewards.rm_encoding import MARKERS, MAX_LENGTH
from race.tasks.arith import END_MARK, ArithTask

#: The recipe fields added with policy data (left out of the hash at their defaults).
POLICY_FIELDS = ("scoring", "policies", "temperature", "n_train_problems", "synthetic_frac", "balance", "n_val_problems")
#: Bumped when the data, model or training code changes in a way the recipe does not capture.
RM_VERSION = 1
CACHE = ArtefactCache("rm")


@dataclass(frozen=True)
class RMRecipe(RecipeSchedule):
    """How one reward model is trained (every field enters the cache hash)."""

    kind: str  # "prm" | "orm"
    backbone: str  # tiny family size whose dims the RM uses
    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    correct_frac: float = 0.4
    task: dict[str, Any] = field(default_factory=lambda: ArithTask().describe())
    n_eval: int = 400
    init: str = "scratch"  # "scratch": random init; "base": start from the backbone's warm start
    # -- policy data (race.builds.rm_samples); at these defaults a recipe hashes as before
    scoring: str = "head"  # "head": a trained classifier head; "likelihood": the warm start's step likelihood
    policies: tuple[str, ...] = ()  # warm starts whose samples the RM trains on (empty: synthetic data only)
    temperature: float = 1.0  # the sampling temperature (the GRPO training temperature)
    n_train_problems: int = 0  # train-split problems sampled once per policy (the training pool)
    synthetic_frac: float = 1.0  # share of each batch drawn from programmatic corruptions (the rest: the pool)
    balance: bool = False  # weight the loss so wrong and right labels count equally in every batch
    n_val_problems: int = 0  # problems per policy of the validation set (the recall threshold is chosen there)

    def __post_init__(self) -> None:
        if self.kind not in classifier_kinds():
            raise ValueError(f"RMRecipe.kind must be one of {', '.join(classifier_kinds())}, got {self.kind!r}")
        if self.init not in ("base", "scratch"):
            raise ValueError(f"RMRecipe.init must be 'base' or 'scratch', got {self.init!r}")
        tiny_config_kwargs(self.backbone)  # raises KeyError naming the family
        if self.scoring not in ("head", "likelihood"):
            raise ValueError(f"RMRecipe.scoring must be 'head' or 'likelihood', got {self.scoring!r}")
        if self.scoring == "likelihood" and (self.init != "base" or not self.policies or self.n_train_problems < 1):
            raise ValueError("RMRecipe(scoring='likelihood') is read off a warm start and calibrated on policy "
                             "samples: set init='base', policies and n_train_problems >= 1")
        for p in self.policies:
            tiny_config_kwargs(p)
        if not 0.0 <= self.synthetic_frac <= 1.0:
            raise ValueError(f"RMRecipe.synthetic_frac={self.synthetic_frac}: must lie in 0..1")
        if self.synthetic_frac < 1.0 and (not self.policies or self.n_train_problems < 1):
            raise ValueError("RMRecipe: synthetic_frac < 1 draws from policy samples: name `policies` "
                             "(e.g. ('tiny-s', 'tiny-m')) and set n_train_problems >= 1")
        if self.temperature <= 0 or self.n_train_problems < 0 or self.n_val_problems < 0:
            raise ValueError(f"RMRecipe needs temperature > 0 and n_train_problems, n_val_problems >= 0, got "
                             f"{self.temperature}, {self.n_train_problems}, {self.n_val_problems}")
        self._check_schedule()

    def hash_fields(self) -> dict[str, Any]:
        """The fields that enter the cache hash: every field, except the policy-data fields
        left at their defaults (so the recipes from before they existed keep their hashes,
        and their packaged artefacts stay valid)."""
        d = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if f.name in POLICY_FIELDS and d[f.name] == f.default:
                d.pop(f.name)
        return d

    @property
    def num_labels(self) -> int:
        return reward_kind(self.kind).labels


#: Policy samples the likelihood PRMs are calibrated on: the three warm starts GRPO starts
#: from, at the training temperature, 500 train-split problems each.
_POOL = dict(policies=("tiny-s", "tiny-m", "tiny-l"), temperature=1.0, n_train_problems=500, synthetic_frac=0.0)

#: The reward models RACE builds (``race rm build``), feedback strength as an axis
#: (held-out figures: ``race rm eval``, docs/reward-models.md):
#:   prm-xs  classifier head on tiny-xs dims, random init, 400 steps on programmatic
#:           corruptions: the weakest (misses most arithmetic slips);
#:   prm-s   the tiny-s warm start's step likelihood, calibrated on policy samples: medium;
#:   prm-m   the tiny-m warm start's step likelihood, calibrated likewise: the strong PRM.
#: ``orm-m``: the tiny-m warm start's likelihood of the whole completion, calibrated on
#: final-answer correctness (built on demand); ``orm-xs``/``orm-s``: classifier heads on
#: programmatic corruptions. No ORM is packaged.
RM_RECIPES: dict[str, RMRecipe] = {
    "prm-xs": RMRecipe("prm", "tiny-xs", steps=400),
    "prm-s": RMRecipe("prm", "tiny-s", steps=100, warmup_steps=0, init="base", scoring="likelihood", **_POOL),
    "prm-m": RMRecipe("prm", "tiny-m", steps=100, warmup_steps=0, init="base", scoring="likelihood", **_POOL),
    "prm-l": RMRecipe("prm", "tiny-l", steps=100, warmup_steps=0, init="base", scoring="likelihood", **_POOL),
    "orm-m": RMRecipe("orm", "tiny-m", steps=100, warmup_steps=0, init="base", scoring="likelihood", **_POOL),
    "orm-xs": RMRecipe("orm", "tiny-xs", steps=400),
    "orm-s": RMRecipe("orm", "tiny-s", steps=300),
}


def known_rms() -> list[str]:
    return list(RM_RECIPES)


def recipe_for(name: str) -> RMRecipe:
    if name not in RM_RECIPES:
        raise KeyError(f"unknown reward model {name!r}; RACE builds: {', '.join(RM_RECIPES)} "
                       "(or pass a local HF directory as orm:/path or prm:/path)")
    return RM_RECIPES[name]


def recipe_hash(name: str, recipe: RMRecipe | None = None) -> str:
    """12 hex digits over the recipe, the backbone config, the tokenizer alphabet and (for
    ``init="base"``) the warm start's own recipe hash, so a new warm start rebuilds the RM."""
    recipe = recipe or recipe_for(name)
    base = ""
    if recipe.init == "base":
        base = base_hash(recipe.backbone)
    return recipe_digest(dict(version=RM_VERSION, name=name, recipe=recipe.hash_fields(), base=base,
                              config=tiny_config_kwargs(recipe.backbone), alphabet="".join(ALPHABET),
                              special=SPECIAL_TOKENS))


def rm_dir(name: str, *, cache_dir: str | os.PathLike[str] | None = None, recipe: RMRecipe | None = None) -> Path:
    """Directory of reward model ``name`` under ``recipe`` (default :data:`RM_RECIPES`)."""
    return CACHE.directory(name, recipe_hash(name, recipe), cache_dir)


@dataclass
class RMInfo:
    """What ``info.json`` holds about a built reward model (``reused`` is not stored)."""

    name: str
    kind: str
    path: str
    recipe: dict[str, Any]
    recipe_hash: str
    total_params: int
    shape: dict[str, Any]
    steps: int
    tokens_processed: int
    real_tokens: int
    scored_positions: int
    train_flops: int
    flops_conventions: str
    seconds: float
    final_loss: float
    eval: dict[str, float]
    origin: dict[str, Any] = field(default_factory=dict)
    cpu_seconds: float | None = None  # process CPU time of the training loop (None: built before it was recorded)
    data: dict[str, Any] = field(default_factory=dict)  # policy data: pool, its sampling FLOPs, held-out quality
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        return d


def read_info(path: Path) -> RMInfo | None:
    """The :class:`RMInfo` of the RM at ``path``, ``None`` when none is built there."""
    return CACHE.read_info(path, lambda data: RMInfo(**data, reused=True))


def rm_path(name: str, *, cache_dir: str | os.PathLike[str] | None = None, recipe: RMRecipe | None = None) -> Path:
    """Directory of the built RM ``name``; a :class:`NotBuiltError` naming the command that
    builds it when there is none (loading never builds: ``race.builds.demand.ensure_rm``)."""
    path = rm_dir(name, cache_dir=cache_dir, recipe=recipe)
    if read_info(path) is None:
        raise NotBuiltError(f"reward model {name!r} is not built (no checkpoint at {path}): run "
                            f"`race rm build --names {name}` or let a run build it")
    return path


def shape_of_rm(name: str) -> Any:
    """``ModelShape`` of RACE's RM ``name`` from its recipe alone (no torch, nothing
    built): for ``race flops --reward prm:prm-s`` and planning."""
    from dataclasses import replace

    recipe = recipe_for(name)
    base = ModelShape.from_hf_config(dict(tiny_config_kwargs(recipe.backbone), model_type="qwen2"), name=name)
    if recipe.scoring == "likelihood":
        return base  # the warm start's causal LM, lm_head as its head (race.rewards.rm_likelihood)
    return replace(base, head=((base.hidden, recipe.num_labels),), head_bias=reward_kind(recipe.kind).per_step,
                   tie_embeddings=False)


def rm_settings(recipe: RMRecipe, max_length: int = MAX_LENGTH) -> dict[str, Any]:
    """``race_rm.json`` of a RACE-built RM (how ``race.rewards.hf`` reads it)."""
    d: dict[str, Any] = dict(kind=recipe.kind, chat_template=False, max_length=max_length)
    if recipe.scoring == "likelihood":
        d["scoring"] = "likelihood"
    if reward_kind(recipe.kind).per_step:
        d.update(markers=list(MARKERS), final_marker=END_MARK)
    return d


# -- which reward model a learned target names ---------------------------------------------------
@dataclass(frozen=True)
class LearnedTarget:
    """What the target of an ``orm:``/``prm:`` spec names (see :func:`learned_target`):
    ``source`` ``"path"`` (a local directory or config: ``name`` its base name), ``"recipe"``
    (RACE's own RM: ``name`` the recipe name, ``recipe`` its :class:`RMRecipe`) or ``"hub"``
    (anything else: a preset or hub name; planning reads its shape, loading refuses it)."""

    kind: str
    source: str  # "path" | "recipe" | "hub"
    name: str
    ref: str  # the target as written
    recipe: RMRecipe | None = None


def learned_target(kind: str, target: str) -> LearnedTarget:
    """The ONE rule for which reward model ``kind:target`` names (loading, planning, building
    on demand, the grid's prebuild and the report's RM card all ask here), in this order:

    1. a path wins (``race.models.refs.looks_like_path``: ``./x``, ``/x``, ``~/x``, ``x.json``
       or anything that exists on disk), so a user can point at their own checkpoint even
       when it is named like one of RACE's recipes;
    2. a RACE recipe name (:data:`RM_RECIPES`): its kind must be ``kind``, else
       ``ValueError`` naming the mismatch and the spec to write instead (``prm:orm-xs`` ->
       ``orm:orm-xs``);
    3. anything else is a hub or preset name (``source="hub"``).
    """
    from race.models.refs import looks_like_path

    ref = str(target)
    if looks_like_path(ref):
        return LearnedTarget(kind, "path", Path(ref).expanduser().name, ref)
    recipe = RM_RECIPES.get(ref)
    if recipe is None:
        return LearnedTarget(kind, "hub", ref, ref)
    if recipe.kind != kind:
        same = ", ".join(n for n, r in RM_RECIPES.items() if r.kind == kind)
        a = {"orm": "an ORM", "prm": "a PRM"}
        same = ", ".join(n for n, r in RM_RECIPES.items() if r.kind == kind)
        raise ValueError(f"{ref!r} is {a[recipe.kind]}, not {a.get(kind, kind)}: write {recipe.kind}:{ref}, "
                         f"or name one of RACE's {kind.upper()}s ({same}) or a local directory ({kind}:/path)")
    return LearnedTarget(kind, "recipe", ref, ref, recipe)
