"""Reward and feedback systems, chosen by name: rule-based, random control, outcome and
process reward models, generative judges. Each reports the FLOPs it executed."""

from race.rewards.base import RewardFunction, RewardOutput
from race.rewards.registry import make_reward, register
from race.rewards.rule import RandomReward, RuleReward

__all__ = ["RandomReward", "RewardFunction", "RewardOutput", "RuleReward", "make_reward", "register"]
