"""Policy samples for RACE's reward models: what the warm starts actually write.

A reward model used during GRPO scores the POLICY's completions, so it is trained and
judged on them: :func:`policy_samples` draws completions from the packaged warm starts
(``tiny-s``/``tiny-m``/``tiny-l``, :mod:`race.builds.warmstart`, built first when missing) at the training
temperature (pure temperature sampling: no top-k, no top-p) on the built-in task's
problems, and the task's verifier (:func:`race.tasks.verify`) labels every step exactly
(:func:`race.builds.rm_data.marker_labels`). At temperature 1 the warm starts' wrong
steps are almost all arithmetic slips (``32-8=23``, usually off by 1-2), some copied
from a slipped result (valid under error-carried-forward), rarely a wrong operand.

Three disjoint sample sets per task (see :class:`SampleSet`):

- ``train``: problems of the task's ``train`` split (what the RM learns from);
- ``val``: other ``train``-split problems (drawn under another seed, any expression in
  the training set removed): where the recall threshold is chosen;
- ``heldout``: problems of the ``test`` split (disjoint from ``train`` by construction)
  under yet another sampling seed: where quality is reported.

A set is sampled once and cached as JSON under ``<cache>/rm-samples/<digest>.json``
(digest over the set's description, the policies' recipe hashes and :data:`SAMPLES_VERSION`),
written to a temporary name and renamed into place. Sampling is deterministic under the
seed for a given torch thread count. ``flops`` records what the sampling executed
(``race.accounting.generate_flops`` over each padded batch: HF ``generate`` runs every
row to the longest), the data cost of an RM, kept apart from its training FLOPs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from race.artefacts.cache import cache_root, recipe_digest
from race.tasks.arith import ArithTask, Problem, make_problem, step_seed

#: Bumped when sampling changes in a way the set's description does not capture.
SAMPLES_VERSION = 1
#: The set kinds and the (task split, seed offset) each draws its problems from.
KINDS = {"train": ("train", 0), "val": ("train", 7_919), "heldout": ("test", 104_729)}
_TOKEN = re.compile(r"[0-9]+|[+-]")


@dataclass(frozen=True)
class SampleSet:
    """``n_problems`` problems of the set's split, one completion per problem per policy."""

    kind: str  # train | val | heldout
    policies: tuple[str, ...]
    n_problems: int
    temperature: float = 1.0
    seed: int = 0
    max_new_tokens: int = 48

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"SampleSet.kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if not self.policies:
            raise ValueError("SampleSet.policies is empty: name warm starts to sample, e.g. ('tiny-s', 'tiny-m')")
        if self.n_problems < 1 or self.temperature <= 0 or self.max_new_tokens < 1:
            raise ValueError(f"SampleSet needs n_problems >= 1, temperature > 0 and max_new_tokens >= 1, got "
                             f"{self.n_problems}, {self.temperature}, {self.max_new_tokens}")


def problem_of(expression: str) -> Problem:
    """The :class:`Problem` of an expression such as ``"23+5-7"`` (parsed, never evaluated)."""
    toks = _TOKEN.findall(expression)
    if "".join(toks) != expression or len(toks) < 3 or len(toks) % 2 == 0:
        raise ValueError(f"not a chained +/- expression: {expression!r}")
    return make_problem([int(t) for t in toks[0::2]], toks[1::2])


def set_problems(task: ArithTask, s: SampleSet, exclude: set[str] | None = None) -> list[Problem]:
    """The set's problems: ``n_problems`` of its split under its seed, none in ``exclude``."""
    split, offset = KINDS[s.kind]
    extra = len(exclude or ())
    probs = task.problems(split, s.n_problems + min(extra, 4 * s.n_problems), seed=step_seed(s.seed, offset))
    kept = [p for p in probs if p.expression not in (exclude or set())]
    return kept[: s.n_problems]


def sample_completions(name: str, problems: list[Problem], *, temperature: float, seed: int, max_new_tokens: int,
                       batch_size: int = 256, cache_dir: Any = None) -> tuple[list[str], int]:
    """One completion per problem from warm start ``name`` (HF ``generate``, pure
    temperature sampling, global RNG seeded by ``seed`` and restored afterwards) and the
    FLOPs that executed (prefill + KV-cache decode over each padded batch)."""
    import torch

    from race.accounting import generate_flops
    from race.builds.warmstart import build_base
    from race.models.loading import load_policy
    from race.models.refs import model_shape

    build_base(name, cache_dir=cache_dir)  # the warm start (reused when built)
    model, tok = load_policy(name, device="cpu", dtype="float32", cache_dir=cache_dir)
    shape = model_shape(model)
    out: list[str] = []
    flops = 0
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        for i in range(0, len(problems), batch_size):
            enc = tok([p.prompt for p in problems[i: i + batch_size]], return_tensors="pt", padding=True,
                      add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                                     top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id)
            B, P = enc["input_ids"].shape
            T = gen.shape[1] - P
            flops += generate_flops(shape, [P] * B, [T] * B)
            out.extend(tok.batch_decode(gen[:, P:], skip_special_tokens=True))
    finally:
        torch.random.set_rng_state(state)
    return out, flops


def _digest(task: ArithTask, s: SampleSet, exclude_digest: str) -> str:
    from race.models.base_recipes import recipe_hash

    return recipe_digest(dict(version=SAMPLES_VERSION, set=asdict(s), task=task.describe(), exclude=exclude_digest,
                              policies={p: recipe_hash(p) for p in s.policies}))


def load_samples(task: ArithTask, s: SampleSet, *, exclude: set[str] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The set (sampled now, or read from the cache): ``{"pairs": [(problem, completion,
    policy), ...], "flops": {policy: FLOPs}, "digest": ...}``. ``exclude``: expressions
    the set must not contain (the validation set excludes the training set's problems)."""
    ex = recipe_digest({"exclude": sorted(exclude)}) if exclude else ""
    digest = _digest(task, s, ex)
    path = cache_root(cache_dir) / "rm-samples" / f"{s.kind}-{digest}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = None
    if data is None:
        problems = set_problems(task, s, exclude)
        rows: list[list[str]] = []
        flops: dict[str, int] = {}
        for j, name in enumerate(s.policies):
            texts, f = sample_completions(name, problems, temperature=s.temperature, seed=step_seed(s.seed, j),
                                          max_new_tokens=s.max_new_tokens, cache_dir=cache_dir)
            rows.extend([p.expression, t, name] for p, t in zip(problems, texts))
            flops[name] = f
        data = dict(digest=digest, set=asdict(s), rows=rows, flops=flops)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    cache: dict[str, Problem] = {}
    pairs = [(cache.setdefault(e, problem_of(e)), t, name) for e, t, name in data["rows"]]
    return dict(pairs=pairs, flops=data["flops"], digest=data["digest"])


def training_pool(recipe: Any, *, cache_dir: str | os.PathLike[str] | None = None
                  ) -> tuple[list[tuple[Problem, str]] | None, dict[str, Any]]:
    """The recipe's policy-sample pool (``None`` for synthetic-only recipes) and what
    ``info.json`` records of it: size, policies, temperature and the FLOPs sampling it
    executed (``sampling_flops``: the RM's data cost, apart from its training FLOPs)."""
    if not recipe.policies or recipe.n_train_problems < 1:
        return None, {}
    s = SampleSet("train", tuple(recipe.policies), recipe.n_train_problems, recipe.temperature, recipe.seed)
    got = load_samples(recipe.make_task(), s, cache_dir=cache_dir)
    pool = [(p, c) for p, c, _ in got["pairs"]]
    return pool, dict(pool_samples=len(pool), policies=list(recipe.policies), temperature=recipe.temperature,
                      sampling_flops=int(sum(got["flops"].values())), pool_digest=got["digest"])
