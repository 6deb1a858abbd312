"""Exact, analytic FLOP accounting of GRPO steps. Standard library only.

Conventions are stated in ``race.accounting.conventions`` and printed with every number.
"""

from .budget import Allocation, allocations, plan_allocations, split_shares, steps_in_budget, update_share
from .conventions import PRESETS as CONVENTION_PRESETS
from .conventions import Conventions
from .errors import AccountingError
from .guard import BudgetGuard, StepPlan, check_budget, counted, steps_bought
from .grpo import (
    PHASES,
    RULE,
    SPLIT,
    SPLIT_COLUMNS,
    PhaseFlops,
    RewardSystem,
    phase_flops,
    prompt_groups,
    reward_model_flops,
    rollout_components,
    learning_flops,
    split_sums,
    step_flops,
)
from .compat import grpo_step_flops, learning_components, uniform_step_flops
from .policy import PolicyCost
from .ledger import BudgetExceededError, FlopLedger, LedgerCorruptError, LedgerRecord
from .lora import LoRA
from .passes import (
    Work,
    backward_components,
    forward_components,
    forward_flops,
    generate_components,
    generate_flops,
    generate_work,
    layers_forward_flops,
    recompute_flops,
    sequence_work,
    shared_prompt_work,
    train_flops,
)
from .report_card import ReportCard, log_values
from .shapes import LAYER_MATRICES, ModelShape, preset_names, published_sizes

__all__ = [
    "AccountingError", "Allocation", "allocations", "BudgetExceededError", "BudgetGuard", "StepPlan", "check_budget",
    "counted",
    "steps_bought", "CONVENTION_PRESETS", "Conventions", "FlopLedger",
    "LAYER_MATRICES", "LedgerCorruptError", "LedgerRecord", "LoRA", "ModelShape", "PHASES", "PhaseFlops", "PolicyCost", "RULE",
    "SPLIT", "SPLIT_COLUMNS", "split_sums",
    "ReportCard", "RewardSystem", "Work", "backward_components", "forward_components", "forward_flops",
    "generate_components", "generate_flops", "generate_work", "grpo_step_flops", "step_flops", "layers_forward_flops",
    "learning_components", "learning_flops", "log_values", "phase_flops", "prompt_groups", "rollout_components", "plan_allocations", "recompute_flops", "preset_names", "published_sizes", "reward_model_flops", "sequence_work", "shared_prompt_work", "split_shares", "update_share",
    "steps_in_budget", "train_flops", "uniform_step_flops",
]
