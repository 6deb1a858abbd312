"""Golden numbers for the accounting core, written as arithmetic (verl style): each expected
value spells out the formula it checks, so a reader can audit it without running code."""

from __future__ import annotations

from fractions import Fraction

import pytest

from race.accounting import (
    LAYER_MATRICES,
    AccountingError,
    Conventions,
    LoRA,
    ModelShape,
    RewardSystem,
    backward_components,
    forward_flops,
    generate_components,
    generate_flops,
    grpo_step_flops,
    preset_names,
    published_sizes,
    recompute_flops,
    reward_model_flops,
    sequence_work,
    train_flops,
    uniform_step_flops,
)

# A small shape whose every number is easy to write out.
S = ModelShape("golden", num_layers=2, hidden=16, num_heads=4, num_kv_heads=2, head_dim=4, intermediate=24, vocab=50)
h, q, kv, I, V, L, H, d = 16, 16, 8, 24, 50, 2, 4, 4
MATS = h * q + h * kv + h * kv + q * h + h * I + h * I + I * h  # per-layer weight MACs per token
N = S.num_params()


# -- model shapes and presets --------------------------------------------------------------------
def test_num_params_written_out():
    layer = MATS + (q + 2 * kv) + 2 * h  # matrices, q/k/v biases, two RMSNorms
    assert S.layer_params() == layer
    assert N == V * h + L * layer + h + V * h  # embedding, layers, final norm, untied lm_head
    tied = ModelShape("t", num_layers=2, hidden=16, num_heads=4, num_kv_heads=2, head_dim=4, intermediate=24,
                      vocab=50, tie_embeddings=True)
    assert tied.num_params() == N - V * h


@pytest.mark.parametrize("name", [n for n in preset_names() if n in published_sizes()])
def test_presets_match_published_sizes(name):
    assert abs(ModelShape.from_preset(name).num_params() / 1e9 - published_sizes()[name]) <= 0.1


def test_every_qwen25_preset_is_known_and_instruct_aliases():
    names = set(preset_names())
    assert {f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b")} <= names
    assert set(published_sizes()) == {f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b")}
    assert ModelShape.from_preset("Qwen2.5-7B-Instruct") == ModelShape.from_preset("qwen2.5-7b")
    with pytest.raises(AccountingError, match="unknown model preset"):
        ModelShape.from_preset("qwen9-1t")


def test_math_prm_preset_head():
    prm = ModelShape.from_preset("qwen2.5-math-prm-7b")
    h7 = 3584
    assert prm.head == ((h7, h7), (h7, 2)) and prm.head_bias
    base = ModelShape.from_preset("qwen2.5-7b")
    assert prm.num_params() == base.num_params() - 152064 * h7 + (h7 * h7 + h7) + (h7 * 2 + 2)


# -- conventions: published formulas reproduced ---------------------------------------------------------
LLAMA2_7B = ModelShape("llama2-7b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=32, head_dim=128,
                       intermediate=11008, vocab=32000, qkv_bias=False)
QWEN25_7B = ModelShape.from_hf_config({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
                                       "intermediate_size": 18944, "num_hidden_layers": 28,
                                       "num_attention_heads": 28, "num_key_value_heads": 4})


def _verl_dense_n(vocab, hidden, inter, layers, heads, kv_heads):
    """verl's FlopsCounter (_estimate_qwen2_flops) dense parameter count, written out."""
    head_dim = hidden // heads
    mlp_n = hidden * inter * 3
    attn_linear_n = hidden * (heads * head_dim + 2 * kv_heads * head_dim + heads * head_dim)
    emb_and_lm_head_n = vocab * hidden * 2
    return (mlp_n + attn_linear_n) * layers + emb_and_lm_head_n


def _verl(vocab, hidden, inter, layers, heads, kv_heads, lens, attn_coeff):
    """verl's total FLOPs of one training pass over a batch of ``lens``: 6 x dense_n per
    token + attn_coeff x sum(seqlen^2) x layers x heads x head_dim (attn_coeff 6 since
    PR #4959, 12 before). verl's test reads FlopsCounter.estimate_flops(lens, delta_time=1),
    which reports TFLOP/s: the total / 1e12."""
    head_dim = hidden // heads
    dense_n = _verl_dense_n(vocab, hidden, inter, layers, heads, kv_heads)
    return 6 * dense_n * sum(lens) + attn_coeff * sum(s * s for s in lens) * layers * heads * head_dim


# verl tests/utils/test_flops_counter.py, current (after PR #4959, January 2026): attention
# 6*sum(seqlen^2)*layer*head*head_dim. The expected totals, their arithmetic as verl writes it:
VERL_CURRENT = [
    # llama2-7B: 6*(32000*4096*2+32*(4096*4096*4+4096*11008*3))*(512+1024+2048)
    #            + 6*(512*512+1024*1024+2048*2048)*32*4096
    (LLAMA2_7B, [512, 1024, 2048], 149226491215872,
     6 * (32000 * 4096 * 2 + 32 * (4096 * 4096 * 4 + 4096 * 11008 * 3)) * (512 + 1024 + 2048)
     + 6 * (512 * 512 + 1024 * 1024 + 2048 * 2048) * 32 * 4096),
    (LLAMA2_7B, [4096] * 3, 536372695793664,
     6 * (32000 * 4096 * 2 + 32 * (4096 * 4096 * 4 + 4096 * 11008 * 3)) * (4096 * 3)
     + 6 * (4096 * 4096 * 3) * 32 * 4096),
    # Qwen2.5-7B-Instruct: q = o = 3584, k = v = 4 kv heads x 128 = 512
    (QWEN25_7B, [512, 1024, 2048], 167073690943488,
     6 * (152064 * 3584 * 2 + 28 * (3584 * (3584 + 512 + 512 + 3584) + 3584 * 18944 * 3)) * (512 + 1024 + 2048)
     + 6 * (512 * 512 + 1024 * 1024 + 2048 * 2048) * 28 * 3584),
    (QWEN25_7B, [4096] * 3, 591764889010176,
     6 * (152064 * 3584 * 2 + 28 * (3584 * (3584 + 512 + 512 + 3584) + 3584 * 18944 * 3)) * (4096 * 3)
     + 6 * (4096 * 4096 * 3) * 28 * 3584),
]

# The same test before PR #4959: 12*sum(seqlen^2)*layer*head*head_dim (the full square).
VERL_LEGACY = [
    (LLAMA2_7B, [512, 1024, 2048], 153555818250240,
     6 * (32000 * 4096 * 2 + 32 * (4096 * 4096 * 4 + 4096 * 11008 * 3)) * (512 + 1024 + 2048)
     + 12 * (512 * 512 + 1024 * 1024 + 2048 * 2048) * 32 * 4096),
    (LLAMA2_7B, [4096] * 3, 575955114393600,
     6 * (32000 * 4096 * 2 + 32 * (4096 * 4096 * 4 + 4096 * 11008 * 3)) * (4096 * 3)
     + 12 * (4096 * 4096 * 3) * 32 * 4096),
    (QWEN25_7B, [512, 1024, 2048], 170388331954176,
     6 * (152064 * 3584 * 2 + 28 * (3584 * (3584 + 512 + 512 + 3584) + 3584 * 18944 * 3)) * (512 + 1024 + 2048)
     + 12 * (512 * 512 + 1024 * 1024 + 2048 * 2048) * 28 * 3584),
    (QWEN25_7B, [4096] * 3, 622070178250752,
     6 * (152064 * 3584 * 2 + 28 * (3584 * (3584 + 512 + 512 + 3584) + 3584 * 18944 * 3)) * (4096 * 3)
     + 12 * (4096 * 4096 * 3) * 28 * 3584),
]
_IDS = ["llama2-7b-mixed", "llama2-7b-4096", "qwen2.5-7b-mixed", "qwen2.5-7b-4096"]


@pytest.mark.parametrize("preset,attn_coeff,case", [
    *[("verl", 6, c) for c in VERL_CURRENT],
    *[("verl-legacy", 12, c) for c in VERL_LEGACY],
], ids=[f"verl-{i}" for i in _IDS] + [f"verl-legacy-{i}" for i in _IDS])
def test_verl_published_values(preset, attn_coeff, case):
    """verl's own golden totals (tests/utils/test_flops_counter.py, which compares
    estimate_flops(lens, 1) = total / 1e12 with math.isclose); here they must match exactly."""
    shape, lens, published, arithmetic = case
    assert arithmetic == published  # the written-out arithmetic is the published number
    assert train_flops(shape, lens, conventions=preset) == published
    assert train_flops(shape, lens, conventions=preset) / 1e12 == pytest.approx(published / 1e12, rel=1e-15)
    args = (shape.vocab, shape.hidden, shape.intermediate, shape.num_layers, shape.num_heads, shape.num_kv_heads)
    assert _verl(*args, lens, attn_coeff) == published


def test_verl_fix_removed_half_the_attention_square():
    """PR #4959 in one line: legacy - current = 6 x sum(seqlen^2) x layers x heads x head_dim."""
    lens = [512, 1024, 2048]
    diff = train_flops(QWEN25_7B, lens, conventions="verl-legacy") - train_flops(QWEN25_7B, lens, conventions="verl")
    assert diff == 170388331954176 - 167073690943488 == 6 * (512**2 + 1024**2 + 2048**2) * 28 * 28 * 128


LENS = [5, 9, 12]
TOK, SQ = sum(LENS), sum(s * s for s in LENS)


def test_megatron_formula():
    # verl-legacy without the embedding term: 6 x (matrices + lm_head) per token + 12 sum(s^2) L H d
    assert train_flops(S, LENS, conventions="megatron") == 6 * (L * MATS + V * h) * TOK + 12 * SQ * L * H * d


def _megatron_lm(b, s, L, h, f, H, G, V):
    """Megatron-LM's num_floating_point_operations (GQA, SwiGLU), written out:
    12 b s L h^2 (1 + (f/h)(3/2) + G/H + s/h + V/(2 L h))."""
    return Fraction(12 * b * s * L * h * h) * (1 + Fraction(f, h) * Fraction(3, 2) + Fraction(G, H) + Fraction(s, h)
                                               + Fraction(V, 2 * L * h))


@pytest.mark.parametrize("shape", [LLAMA2_7B, QWEN25_7B], ids=["llama2-7b", "qwen2.5-7b"])
def test_megatron_lm_published_formula(shape):
    b, s = 3, 4096
    expected = _megatron_lm(b, s, shape.num_layers, shape.hidden, shape.intermediate, shape.num_heads,
                            shape.num_kv_heads, shape.vocab)
    assert expected.denominator == 1
    assert train_flops(shape, [s] * b, conventions="megatron") == expected


def test_verl_formula_small():
    # current verl: half the square, 6 sum(s^2) L H d per training pass (3 x forward 4 x s^2/2 pairs x H d)
    assert train_flops(S, LENS, conventions="verl") == 6 * (L * MATS + 2 * V * h) * TOK + 6 * SQ * L * H * d
    assert train_flops(S, LENS, conventions="verl-legacy") == 6 * (L * MATS + 2 * V * h) * TOK + 12 * SQ * L * H * d


def test_half_square_attention_odd_lengths_are_exact():
    """s^2/2 pairs is a half pair for odd s; the FLOPs stay whole (forward 4 x s^2/2 x H d
    = 2 s^2 H d) and no rounding creeps in: 5 and 9 are odd."""
    half = Conventions(attention="half")
    assert forward_flops(S, [5], conventions=half) == 2 * 5 * L * MATS + 2 * 25 * L * H * d + 2 * 5 * h * V
    assert isinstance(forward_flops(S, LENS, conventions=half), int)
    assert train_flops(S, LENS, conventions="verl") - train_flops(S, LENS, conventions="verl-legacy") \
        == -6 * (25 + 81 + 144) * L * H * d


def test_half_square_attention_is_additive_over_decode():
    """Block of n over c cached: n*c + n^2/2 pairs; decoding T-1 one-token steps after a
    P-token prefill therefore adds up to the pairs of the whole P+T-1 sequence."""
    half = Conventions(attention="half")
    P, Tn = 7, 6
    gen = generate_components(S, [P], [Tn], conventions=half)
    s_all = P + Tn - 1
    pairs_all = Fraction(s_all * s_all, 2)  # 12^2/2 = 72
    assert Fraction(gen["prefill"] + gen["decode"]) == (
        s_all * (2 * L * MATS) + 4 * pairs_all * L * H * d + Tn * 2 * h * V)
    dec_pairs = sum(Fraction(2 * (P + j - 1) + 1, 2) for j in range(1, Tn))  # P+j-1 cached, +1/2
    assert gen["decode"] == (Tn - 1) * 2 * L * MATS + 4 * dec_pairs * L * H * d + (Tn - 1) * 2 * h * V


def test_palm_formula():
    # PaLM appendix B: 6N + 12 L H Q T per token (T = that sequence's length), N all parameters
    assert train_flops(S, LENS, conventions="palm") == sum(6 * N * s + 12 * L * H * d * s * s for s in LENS)


def test_6nd_formula():
    assert train_flops(S, LENS, conventions="6nd") == 6 * N * TOK
    assert forward_flops(S, LENS, conventions="6nd") == 2 * N * TOK


def test_torch_convention_full_square_exact_backward():
    fwd = 2 * TOK * L * MATS + 4 * L * H * d * SQ + 2 * TOK * h * V
    assert forward_flops(S, LENS, conventions="torch") == fwd
    assert train_flops(S, LENS, conventions="torch") == 3 * fwd  # full fine-tuning, exact = 3x here


def test_race_default_forward_causal_and_head_where_computed():
    pairs = sum(s * (s + 1) // 2 for s in LENS)
    dense, att = 2 * TOK * L * MATS, 4 * L * H * d * pairs
    assert forward_flops(S, LENS) == dense + att + 2 * TOK * h * V
    assert forward_flops(S, LENS, logits="last") == dense + att + 2 * 3 * h * V
    assert forward_flops(S, LENS, logits=4) == dense + att + 2 * (4 + 4 + 4) * h * V
    assert forward_flops(S, LENS, logits=[1, 0, 12]) == dense + att + 2 * 13 * h * V
    assert forward_flops(S, LENS, logits=20) == forward_flops(S, LENS, logits="all")  # HF keeps at most s
    assert forward_flops(S, LENS, conventions=Conventions(attention="none")) == dense + 2 * TOK * h * V
    assert forward_flops(S, LENS, conventions=Conventions(embedding=True)) == dense + att + 4 * TOK * h * V


def test_conventions_describe_and_validate():
    assert "causal attention" in Conventions().describe()
    assert "full-square" in Conventions.preset("torch").describe()
    with pytest.raises(AccountingError, match="unknown conventions"):
        Conventions.preset("chinchilla")
    assert "half-square" in Conventions.preset("verl").describe()
    assert "full-square" in Conventions.preset("verl-legacy").describe()
    with pytest.raises(AccountingError, match="attention must be one of causal, half, full, none"):
        Conventions(attention="quarter")
    with pytest.raises(AccountingError, match="backward='2x'"):
        train_flops(S, LENS, conventions=Conventions(dense="params"))


# -- generation ----------------------------------------------------------------------------------
def test_generate_written_out():
    P, Tn = 7, 5  # prefill 7 tokens, logits at the last; then 4 one-token steps over 7+j-1 cached
    per_tok = 2 * L * MATS
    prefill = P * per_tok + 4 * L * H * d * (P * (P + 1) // 2) + 2 * h * V
    dec_pairs = sum(P + j for j in range(1, Tn))
    decode = (Tn - 1) * per_tok + 4 * L * H * d * dec_pairs + (Tn - 1) * 2 * h * V
    assert generate_components(S, [P], [Tn]) == {"prefill": prefill, "decode": decode}
    # torch's full square only changes the prefill (one new token: causal == full)
    full_prefill = P * per_tok + 4 * L * H * d * P * P + 2 * h * V
    assert generate_components(S, [P], [Tn], conventions="torch") == {"prefill": full_prefill, "decode": decode}
    # a one-token completion is the prefill alone
    assert generate_components(S, [P], [1])["decode"] == 0


def test_generate_share_prompt():
    g = 4
    shared = generate_components(S, [6, 8], [3] * g + [5] * g, share_prompt=True)
    separate = generate_components(S, [6] * g + [8] * g, [3] * g + [5] * g)
    assert shared["decode"] == separate["decode"]
    assert separate["prefill"] == g * shared["prefill"]


# -- LoRA and backward ---------------------------------------------------------------------------
def test_lora_forward_and_backward_written_out():
    one = S.with_layers(1)
    t, r = 10, 3
    base_fwd = 2 * t * MATS + 4 * H * d * t * (t + 1) // 2 + 2 * t * h * V
    # LoRA on down_proj only: layer 0 sees the frozen embedding, so nothing before down_proj
    # needs a gradient; down_proj's A and B get weight grads plus B's input grad.
    lora = LoRA(r, ("down_proj",))
    assert forward_flops(one, [t], lora=lora) == base_fwd + 2 * t * r * (I + h)
    bwd = 2 * t * r * (I + h) + 2 * t * r * h + 2 * t * h * V  # dA+dB, grad into A's output, lm_head input grad
    assert train_flops(one, [t], lora=lora) == base_fwd + 2 * t * r * (I + h) + bwd
    # LoRA on q_proj: dQ and dP in the attention core, then every later matrix's input grad.
    lora = LoRA(r, ("q_proj",))
    att_unit = 2 * H * d * t * (t + 1) // 2
    bwd = (2 * t * r * (h + q) + 2 * t * r * q) + 2 * att_unit + 2 * t * (q * h + 3 * h * I) + 2 * t * h * V
    assert train_flops(one, [t], lora=lora) == base_fwd + 2 * t * r * (h + q) + bwd
    # inputs_require_grad (PEFT + gradient checkpointing) adds layer-0 q/k/v input grads and the
    # rest of the attention core
    with_input = train_flops(one, [t], lora=lora, inputs_require_grad=True)
    assert with_input - train_flops(one, [t], lora=lora) == 2 * t * h * (q + 2 * kv) + 2 * t * r * h + 2 * att_unit


def test_recompute_written_out():
    w = sequence_work([10], "all", None)
    layers = L * (2 * 10 * MATS + 4 * H * d * 55)
    assert recompute_flops(S, w, early_stop=False) == layers
    assert recompute_flops(S, w) == layers - L * 2 * 10 * I * h  # down_proj skipped by the early stop
    lora = LoRA(2, ("down_proj",))
    assert recompute_flops(S, w, lora=lora) == layers + L * 2 * 10 * 2 * (I + h) - L * 2 * 10 * 2 * h


def test_full_finetune_backward_is_2x_forward_without_embedding():
    w = sequence_work(LENS, "all", None)
    b = backward_components(S, w)
    assert b["embedding"] == 0 and sum(b.values()) == 2 * forward_flops(S, LENS)


# -- GRPO phases ---------------------------------------------------------------------------------
def test_grpo_step_phases():
    G, P, Tn = 4, 6, 5
    lora = LoRA(4)
    plens, clens = [P] * (2 * G), [Tn] * (2 * G)
    base = dict(num_generations=G, lora=lora)
    step = grpo_step_flops(S, plens, clens, **base)
    seqs = [P + Tn] * (2 * G)
    assert set(step.components) == {"rollout/prefill", "rollout/decode", "update/forward", "update/backward"}
    assert step.rollout == generate_flops(S, plens, clens, lora=lora)
    assert step.update == train_flops(S, seqs, lora=lora, logits=[Tn] * (2 * G))
    assert step.old_logprobs == step.reference == step.reward == step.recompute == 0
    full = grpo_step_flops(S, plens, clens, num_iterations=3, beta=0.04, recompute=True, **base)
    assert full.old_logprobs == forward_flops(S, seqs, lora=lora, logits=Tn)
    assert full.reference == forward_flops(S, seqs, logits=Tn)  # adapter off: no LoRA FLOPs
    assert full.update == 3 * step.update
    assert full.recompute == 3 * recompute_flops(S, sequence_work(seqs, Tn, None), lora=lora)
    assert full.total == full.rollout + full.old_logprobs + full.reference + full.update
    assert full.hardware_total == full.total + full.recompute
    assert sum(v for k, v in full.components.items() if not k.startswith("recompute/")) == full.total
    tl = grpo_step_flops(S, plens, clens, train_logits="completion+1", **base)
    assert tl.update == train_flops(S, seqs, lora=lora, logits=Tn + 1)
    shared = grpo_step_flops(S, plens, clens, share_prompt=True, **base)
    assert step.components["rollout/prefill"] == G * shared.components["rollout/prefill"]
    assert uniform_step_flops(S, prompts=2, num_generations=G, prompt_len=P, completion_len=Tn,
                              lora=lora).components == step.components


def test_reward_models():
    rm = RewardSystem("orm", ModelShape("rm", num_layers=1, hidden=16, num_heads=4, num_kv_heads=4, head_dim=4,
                                        intermediate=24, vocab=50, head=((16, 1),)))
    c = reward_model_flops(rm, [10, 12])
    assert c["reward/head"] == 2 * 2 * 16 * 1  # the score head at the last position of 2 sequences
    assert reward_model_flops(rm, [10, 12], head_positions="all")["reward/head"] == 2 * 22 * 16
    assert reward_model_flops(RewardSystem("rule"), [10]) == {}
    judge = RewardSystem("judge", S)
    j = reward_model_flops(judge, [10], judge_completion_lens=[4])
    assert j == {"reward/prefill": generate_components(S, [10], [4])["prefill"],
                 "reward/decode": generate_components(S, [10], [4])["decode"]}
    with pytest.raises(AccountingError, match="judge_completion_lens"):
        reward_model_flops(judge, [10])
    with pytest.raises(AccountingError, match="shape"):
        RewardSystem("orm")


# -- errors name the field ------------------------------------------------------------------------
@pytest.mark.parametrize("bad,field", [
    ([0], r"seq_lens\[0\] = 0"),
    ([4, -2], r"seq_lens\[1\] = -2"),
    ([4, 2.5], r"seq_lens\[1\] must be an integer"),
    ([True], r"seq_lens\[0\] must be an integer"),
    ([], "seq_lens is empty"),
    ("abc", "seq_lens must be a list"),
])
def test_bad_sequence_lengths(bad, field):
    with pytest.raises(AccountingError, match=field):
        forward_flops(S, bad)


def test_bad_generation_lengths():
    with pytest.raises(AccountingError, match=r"prompt_lens\[1\] = 0"):
        generate_flops(S, [3, 0], [2, 2])
    with pytest.raises(AccountingError, match=r"completion_lens\[0\] = -1"):
        generate_flops(S, [3], [-1])
    with pytest.raises(AccountingError, match=r"completion_lens\[0\] must be an integer"):
        generate_flops(S, [3], ["4"])
    with pytest.raises(AccountingError, match="prompt_len=0"):
        uniform_step_flops(S, prompts=1, num_generations=2, prompt_len=0, completion_len=3)
    with pytest.raises(AccountingError, match=r"logits\[0\]"):
        forward_flops(S, [4], logits=[5])


@pytest.mark.parametrize("g", [1, 0, 2.0])
def test_group_size_must_be_at_least_two(g):
    with pytest.raises(AccountingError, match="num_generations"):
        grpo_step_flops(S, [4, 4], [3, 3], num_generations=g)


def test_lora_rank_above_matrix_dim():
    with pytest.raises(AccountingError, match=r"k_proj's smaller dimension 8"):
        forward_flops(S, [4], lora=LoRA(9, ("k_proj",)))
    forward_flops(S, [4], lora=LoRA(8, ("k_proj",)))  # rank == min dim is allowed
    with pytest.raises(AccountingError, match="rank"):
        LoRA(0)
    with pytest.raises(AccountingError, match="unknown LoRA target"):
        LoRA(4, ("qkv_proj",))
    assert LoRA(2).num_params(S) == L * 2 * sum(i + o for i, o in S.matrix_dims().values())
    assert LAYER_MATRICES == tuple(S.matrix_dims())


def test_model_shape_validation():
    with pytest.raises(AccountingError, match="ModelShape.hidden"):
        ModelShape("x", num_layers=1, hidden=0, num_heads=1, num_kv_heads=1, head_dim=1, intermediate=1, vocab=1)
    with pytest.raises(AccountingError, match="multiple of num_kv_heads"):
        ModelShape("x", num_layers=1, hidden=8, num_heads=3, num_kv_heads=2, head_dim=4, intermediate=8, vocab=9)


# -- from_hf_config -------------------------------------------------------------------------------
QWEN2_CFG = {"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "use_sliding_window": False, "sliding_window": 4096, "tie_word_embeddings": True}


def test_from_hf_config_reads_qwen2(tmp_path):
    s = ModelShape.from_hf_config(QWEN2_CFG, name="q")  # an inactive sliding window is fine
    assert (s.hidden, s.head_dim, s.num_kv_heads, s.tie_embeddings, s.qkv_bias) == (32, 8, 2, True, True)
    import json

    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN2_CFG))
    assert ModelShape.from_hf_config(d).name == "my-model"
    assert ModelShape.from_hf_config(d / "config.json", name="q") == s
    with pytest.raises(AccountingError, match="no config.json"):
        ModelShape.from_hf_config(tmp_path / "missing")


@pytest.mark.parametrize("extra,field", [
    ({"num_experts": 64}, "num_experts"),
    ({"num_local_experts": 8}, "num_local_experts"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"kv_lora_rank": 512}, "kv_lora_rank"),
])
def test_from_hf_config_refuses_unsupported_fields(extra, field):
    with pytest.raises(AccountingError, match=field):
        ModelShape.from_hf_config({**QWEN2_CFG, **extra})


def test_from_hf_config_mistral_sliding_window_and_missing_fields():
    mistral = {**QWEN2_CFG, "model_type": "mistral", "sliding_window": 4096}
    with pytest.raises(AccountingError, match="sliding_window"):
        ModelShape.from_hf_config(mistral)
    ok = ModelShape.from_hf_config({**mistral, "sliding_window": None})
    assert not ok.qkv_bias
    with pytest.raises(AccountingError, match="model_type 'gpt2'"):
        ModelShape.from_hf_config({**QWEN2_CFG, "model_type": "gpt2"})
    cfg = dict(QWEN2_CFG)
    del cfg["intermediate_size"]
    with pytest.raises(AccountingError, match="intermediate_size"):
        ModelShape.from_hf_config(cfg)
