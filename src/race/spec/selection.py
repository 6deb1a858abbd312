"""The update selections, one row each: which of a prompt's ``num_generations`` rollouts the
update trains on when a run sets ``num_update_generations`` (PODS, arXiv 2504.13818).
Standard library only.

A run generates ``n = num_generations`` rollouts per prompt and, with
``num_update_generations: m < n``, trains on ``m`` of them, chosen per prompt by the rule
``update_selection`` names (:data:`UPDATE_SELECTIONS`):

==============  =========================================  ======================================
name            chooses                                    rule
==============  =========================================  ======================================
max_variance    the m-subset with the largest reward       ``race.engines.selection:max_variance``
                variance (PODS's max-variance
                down-sampling: the top k and bottom m-k
                rewards for the best k)
random          m rollouts uniformly at random (PODS's     ``race.engines.selection:uniform``
                control), from a generator seeded from
                (seed, step)
==============  =========================================  ======================================

Every reader of a selection reads this table: the run file's validation (the names,
``race.spec.run``), the engines (``race.engines.selection.rule``: the function a row
names, imported on first use) and the docs. Adding a selection is one row here and one
function where its row says: ``(rewards, m, rng) -> indices``, ``rng`` a
``random.Random`` the engine seeds per step (a rule that draws nothing ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateSelection:
    """One way to choose the update's rollouts: its name, its rule ``"module:function"``,
    whether it draws random numbers, and what it chooses."""

    name: str
    rule: str
    draws: bool
    summary: str


UPDATE_SELECTIONS: dict[str, UpdateSelection] = {s.name: s for s in (
    UpdateSelection("max_variance", "race.engines.selection:max_variance", False,
                    "the m rollouts whose rewards have the largest variance (PODS)"),
    UpdateSelection("random", "race.engines.selection:uniform", True,
                    "m rollouts uniformly at random (PODS's control)"),
)}
#: The selection a run uses unless it says otherwise.
DEFAULT_SELECTION = "max_variance"


def update_selection(name: str) -> UpdateSelection:
    """The row of selection ``name``; ``ValueError`` names the selections."""
    if name not in UPDATE_SELECTIONS:
        raise ValueError(f"{name!r} is not an update selection: choose one of {', '.join(UPDATE_SELECTIONS)}")
    return UPDATE_SELECTIONS[name]


__all__ = ["DEFAULT_SELECTION", "UPDATE_SELECTIONS", "UpdateSelection", "update_selection"]
