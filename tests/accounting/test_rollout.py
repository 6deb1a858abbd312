"""The executed-rollout rules (race.accounting.rollout): a merged rollout runs the base
weights (no LoRA term) plus one fold per adapted matrix; an unmerged one carries the LoRA
term in every pass. Integer arithmetic, so every comparison is exact."""

from race.accounting import LoRA, ModelShape, PolicyCost, generate_components
from race.accounting.lora import lora_merge_flops
from race.accounting.rollout import executed_gang_decode, executed_rollout

SHAPE = ModelShape.from_preset("qwen2.5-0.5b")
LORA = LoRA(16, ("q_proj", "v_proj"))
DECODED = [7, 12, 12, 3, 9, 12, 12, 1]  # 2 prompts x group 4, rows dropped at different steps


def test_an_unmerged_rollout_is_the_shared_prompt_generation_with_the_lora_term():
    got = executed_rollout(PolicyCost(SHAPE, LORA), 20, 2, DECODED, merged=False)
    assert got == generate_components(SHAPE, [20, 20], DECODED, lora=LORA, share_prompt=True)
    assert "merge" not in got


def test_a_merged_rollout_drops_the_lora_term_and_charges_the_fold_once():
    merged = executed_rollout(PolicyCost(SHAPE, LORA), 20, 2, DECODED, merged=True)
    base = generate_components(SHAPE, [20, 20], DECODED, share_prompt=True)
    assert merged == {**base, "merge": lora_merge_flops(SHAPE, LORA)}
    unmerged = executed_rollout(PolicyCost(SHAPE, LORA), 20, 2, DECODED, merged=False)
    assert merged["prefill"] < unmerged["prefill"] and merged["decode"] < unmerged["decode"]


def test_merged_without_lora_is_the_plain_rollout():
    assert executed_rollout(PolicyCost(SHAPE), 20, 2, DECODED, merged=True) == executed_rollout(PolicyCost(SHAPE), 20, 2, DECODED)


def test_a_gang_decode_charges_every_members_fold_and_no_lora_term():
    loras = [LORA, LoRA(8, ("q_proj", "k_proj", "v_proj", "o_proj"))]
    got = executed_gang_decode(SHAPE, 20, 3, DECODED, loras)
    pre = generate_components(SHAPE, [20] * 3, [1] * 3)["prefill"]
    dec = generate_components(SHAPE, [20] * len(DECODED), DECODED)["decode"]
    assert got == pre + dec + sum(lora_merge_flops(SHAPE, lo) for lo in loras)
    assert executed_gang_decode(SHAPE, 20, 3, DECODED, loras[:1]) == pre + dec + lora_merge_flops(SHAPE, LORA)
