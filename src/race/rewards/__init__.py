"""Reward and feedback systems, chosen by name: rule-based, random control, math-verify,
outcome and process reward models, generative judges, your own Python function. Each reports the FLOPs it executed.

    base.py         the RewardFunction protocol and RewardOutput
    registry.py     spec string -> reward system (grammar: race.spec.reward)
    rule.py         rule-based terms and the random-reward control
    text.py         sanitising, prompt/question text, rule verification of one completion
    terms.py        PRM aggregation and the rule terms a learned reward mixes in
    mathverify.py   ``math``: math-verify final answers (bounded, never evaluated)
    learned.py      ORM / PRM / judge reward functions from a parsed spec
    hf.py           reward models from local HF directories; the generative judge
    python.py       ``py:MODULE:FUNCTION``: your function with TRL's reward_funcs signature
    rm_encoding.py  how a scoring model reads a batch (encoding, scoring forward, Scorer)
    rm_likelihood.py  likelihood PRMs: the scoring model and its loader
    rm_recipes.py   RACE's own RMs: recipes, cache key, shape, where a built one lives,
                    its info.json (torch-free)
    rm_card.py      an RM's quality and cost from its info.json, for reports (torch-free)
    systems.py      reward spec -> accounting RewardSystem (planning, torch-free)

Rewards LOAD reward models, never train them: RACE's RMs, their training data, training,
calibration and held-out evaluation are ``race.builds`` (a floor above this one).
"""

from race.rewards.base import RewardFunction, RewardOutput, reward_bound
from race.rewards.registry import make_reward, register
from race.rewards.rule import RandomReward, RuleReward

__all__ = ["RandomReward", "RewardFunction", "RewardOutput", "RuleReward", "make_reward", "register", "reward_bound"]
