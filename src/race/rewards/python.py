"""Your reward function: a Python callable with TRL's ``reward_funcs`` signature, named by
import path in a run or grid file (``reward: py:mypkg.rewards:correctness``; docs/rewards.md).

The call is TRL's (``GRPOTrainer._calculate_rewards``): keyword arguments in, one number per
completion out::

    def correctness(prompts, completions, answer, **kwargs) -> list[float]: ...

RACE passes ``prompts`` (the rendered prompt strings, chat markup included), ``completions``
(the decoded completion strings) and each field of the task's problems as a column of the
same name (the built-in task: ``id``, ``answer``, ``steps``, ``n_ops``, ``split``; a dataset
task: ``id``, ``answer``, ``question``, ``solution``, ``split``), one entry per completion
(a problem repeated for each of its ``num_generations`` completions). TRL's own extras
(:data:`TRL_ONLY`: ``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``,
``environments``) are not passed: take ``**kwargs`` as TRL's documentation does. Both engines call it the same
way, through :class:`PythonReward`.

Cost. A function is charged as a rule: 0 model FLOPs. One that runs a scoring model
declares it, so RACE charges it::

    correctness.race_reward_model = "orm:path/to/rm"     # or "prm:NAME"

a reward spec of a scoring kind of the reward-kind table (``orm``: the head at the last
token; ``prm``: the head at every position, its planning bound), its ``NAME`` anything
``race flops --model`` takes (a preset, a tiny-family name, a ``config.json``, an HF
directory). Each call is charged as one forward of that model over each completion with its
prompt, ``reward_model_flops`` at the policy tokenizer's lengths of prompt and completion
(unpadded: how your function batches is not known), and the budget guard bounds a step by
the longest prompt of the step's problems and ``k x max_completion_length`` tokens, ``k``
the most tokens one policy token re-encodes to. The planner prices the same model.

Import. By path only, never by evaluating text: ``importlib.import_module(MODULE)`` then the
attribute ``FUNCTION``. The module must be importable where the run runs: installed in the
environment, or its folder on ``PYTHONPATH`` (a local grid's workers are started by the
driver and see its ``sys.path``; a Ray cluster's workers see what each node's ``ray start``
environment sees). The errors say so.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
import time
from typing import Any, Callable, Sequence

from race.accounting import RewardSystem, counted, reward_model_flops
from race.accounting.reward_kinds import REWARD_KINDS
from race.rewards.base import RewardOutput
from race.rewards.rule_terms import outcome
from race.spec.reward import RewardSpec

#: The attribute a reward function declares its scoring model in (module docstring).
MODEL_ATTR = "race_reward_model"

#: What TRL passes a reward function that RACE does not (module docstring).
TRL_ONLY = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")

_FUNCTIONS: dict[str, Callable[..., Any]] = {}


class RewardFunctionError(ValueError):
    """A ``py:`` reward cannot be imported, is not a function, or returned something that
    is not one finite number per completion; the message says what to change."""


def _where_to_put(module: str) -> str:
    return (f"install the package that holds {module!r} in this environment, or put the folder that holds it on "
            f"PYTHONPATH (PYTHONPATH=/path/to/folder race ...); a grid's workers import it too: on a Ray cluster "
            "every node's `ray start` must see it (same PYTHONPATH or an installed package)")


def import_reward_function(path: str) -> Callable[..., Any]:
    """The function ``package.module:function`` names (imported once per process)."""
    if path in _FUNCTIONS:
        return _FUNCTIONS[path]
    module, _, name = path.rpartition(":")
    if not module or not name:
        raise RewardFunctionError(f"reward py:{path}: write py:package.module:function")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
        if module == missing or module.startswith(missing + "."):
            raise RewardFunctionError(f"reward py:{path}: no module named {missing!r} here: "
                                      f"{_where_to_put(module)}") from None
        raise RewardFunctionError(f"reward py:{path}: importing {module!r} failed: it imports {missing!r}, which is "
                                  "not installed here") from e
    except Exception as e:  # noqa: BLE001 - the user's module raised while it loaded
        raise RewardFunctionError(f"reward py:{path}: importing {module!r} raised {type(e).__name__}: {e}") from e
    fn = getattr(mod, name, None)
    if fn is None:
        have = sorted(k for k, v in vars(mod).items() if callable(v) and not k.startswith("_"))
        raise RewardFunctionError(f"reward py:{path}: module {module!r} has no {name!r}; its functions: "
                                  f"{', '.join(have[:12]) or 'none'}")
    if not callable(fn):
        raise RewardFunctionError(f"reward py:{path}: {module}.{name} is a {type(fn).__name__}, not a function")
    _FUNCTIONS[path] = fn
    return fn


def declared_system(path: str, resolve: Callable[[str], Any]) -> RewardSystem | None:
    """The cost of the scoring model the function at ``path`` declares in :data:`MODEL_ATTR`
    (a reward spec of a scoring model kind, ``orm:NAME`` or ``prm:NAME``, resolved by
    ``resolve``: ``race.rewards.systems.resolve_reward``, the one resolver), else None (a
    rule's cost)."""
    decl = getattr(import_reward_function(path), MODEL_ATTR, None)
    if decl is None:
        return None
    scoring = [k.name for k in REWARD_KINDS.values() if k.model and k.planned_head]
    what = (f"declare the scoring model your function runs as {' or '.join(k + ':NAME' for k in scoring)} (NAME: a "
            "preset, a config.json or an HF directory), or remove it to be charged as a rule")
    try:
        resolved = resolve(decl) if isinstance(decl, str) else None
    except ValueError as e:
        raise RewardFunctionError(f"reward py:{path}: {MODEL_ATTR} = {decl!r}: {e}") from None
    if resolved is None or resolved.kind.name not in scoring:
        raise RewardFunctionError(f"reward py:{path}: {MODEL_ATTR} = {decl!r}: {what}")
    return resolved.system


def call_arguments(problems: Sequence[Any], completions: Sequence[str]) -> dict[str, list[Any]]:
    """TRL's keyword arguments for one call: ``prompts``, ``completions`` and each field of
    the problems (their columns) but ``prompt``."""
    kwargs: dict[str, list[Any]] = {"prompts": [p.prompt for p in problems], "completions": list(completions)}
    if problems and dataclasses.is_dataclass(problems[0]):
        for f in dataclasses.fields(problems[0]):
            if f.name != "prompt" and f.name not in kwargs:
                kwargs[f.name] = [getattr(p, f.name) for p in problems]
    return kwargs


def check_rewards(out: Any, n: int, name: str) -> list[float]:
    """``out`` as ``n`` finite floats, else :class:`RewardFunctionError` saying what came back."""
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()  # a numpy array or a torch tensor
    if not isinstance(out, (list, tuple)):
        raise RewardFunctionError(f"reward {name} returned a {type(out).__name__}: return a list of floats, one per "
                                  f"completion ({n} here), as TRL's reward_funcs do")
    if len(out) != n:
        raise RewardFunctionError(f"reward {name} returned {len(out)} rewards for {n} completions: return exactly "
                                  "one per completion, in the order of `completions`")
    rewards = []
    for i, x in enumerate(out):
        if x is None:
            raise RewardFunctionError(f"reward {name} returned None for completion {i}: TRL reads None as 'no reward "
                                      "from this function' among several; RACE trains on one function, so return a "
                                      "number for every completion")
        if not isinstance(x, numbers.Real) or not math.isfinite(float(x)):
            raise RewardFunctionError(f"reward {name} returned {x!r} ({type(x).__name__}) for completion {i}: return "
                                      "a finite float for every completion")
        rewards.append(float(x))
    return rewards


class PythonReward:
    """A ``py:`` reward as a ``RewardFunction`` (module docstring): calls the function,
    checks what it returns, records verified correctness (``outcome``) beside it, and
    charges its declared scoring model (``system``; a rule's 0 FLOPs when none)."""

    kind = "py"

    def __init__(self, spec: RewardSpec, system: RewardSystem, *, tokenizer: Any = None, conventions: Any = None,
                 tokens_per_policy_token: int = 1) -> None:
        self.spec, self.system, self.name = spec, system, str(spec)
        self.fn = import_reward_function(spec.target)
        self.tokenizer, self.conventions, self.k = tokenizer, conventions, tokens_per_policy_token
        self._lengths: dict[str, int] = {}
        if system.is_model and tokenizer is None:
            raise RewardFunctionError(f"reward {self.name}: it declares {getattr(self.fn, MODEL_ATTR)!r}, whose FLOPs "
                                      "are charged at the policy tokenizer's lengths: build it with tokenizer=...")

    def _tokens(self, text: str) -> int:
        if text not in self._lengths:
            self._lengths[text] = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._lengths[text]

    def _model_flops(self, lengths: list[int]) -> dict[str, int]:
        return reward_model_flops(self.system, lengths, head_positions=self.system.row.planned_head or "last",
                                  conventions=self.conventions)

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        t0 = time.perf_counter()
        kwargs = call_arguments(problems, completions)
        try:
            out = self.fn(**kwargs)
        except TypeError as e:
            if "argument" not in str(e):
                raise
            raise RewardFunctionError(f"reward {self.name}: {e}. RACE calls it as TRL does, with keyword arguments "
                                      f"{', '.join(kwargs)} ({', '.join(TRL_ONLY)} are TRL's own and not passed): "
                                      "take the ones you need and **kwargs") from e
        rewards = check_rewards(out, len(completions), self.name)
        seconds = time.perf_counter() - t0
        verified = [outcome(p, c) for p, c in zip(problems, completions, strict=True)]
        if not self.system.is_model:
            return RewardOutput(rewards, verified, seconds=seconds)
        lengths = [self._tokens(p.prompt) + len(self.tokenizer(c, add_special_tokens=False)["input_ids"])
                   for p, c in zip(problems, completions, strict=True)]
        return RewardOutput(rewards, verified, components=self._model_flops(lengths), tokens=sum(lengths),
                            seconds=seconds)

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        """0 for a rule; with a declared model, its forward over ``n_sequences`` of the longest
        prompt (of ``problems``, read whole; else ``max_prompt_len``) and ``k x
        max_completion_len`` completion tokens."""
        if not self.system.is_model:
            return 0
        prompt = max((self._tokens(p.prompt) for p in problems), default=0) if problems else max_prompt_len
        return counted(self._model_flops([max(1, prompt + self.k * max_completion_len)] * n_sequences))


def build_python(reward: Any, *, tokenizer: Any = None, conventions: Any = None, **_: Any) -> PythonReward:
    """A ``py:`` reward from its resolved spec (``race.rewards.systems.ResolvedReward``: its
    ``system`` is the declared model's cost, or a rule's). With a declared model the policy's
    ``tokenizer`` measures what the model reads (``k``: the most tokens one policy token
    re-encodes to, over the whole vocabulary)."""
    system = reward.system
    k = 1
    if system.is_model and tokenizer is not None:
        from race.rewards.learned import tokens_per_policy_token

        k = tokens_per_policy_token(tokenizer, tokenizer, limit=len(tokenizer)) or 1
    return PythonReward(reward.spec, system, tokenizer=tokenizer, conventions=conventions, tokens_per_policy_token=k)


__all__ = ["MODEL_ATTR", "TRL_ONLY", "PythonReward", "RewardFunctionError", "build_python", "call_arguments",
           "check_rewards", "declared_system", "import_reward_function"]
