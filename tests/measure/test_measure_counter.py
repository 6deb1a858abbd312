"""The counter: torch's blind spots on CPU are filled, sdpa measures like eager, the meter
keeps ledger keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from race.accounting import LAYER_MATRICES, FlopLedger, LoRA, forward_flops, generate_flops, train_flops
from race.measure import (
    Counter,
    FlopMeter,
    attention_implementation,
    count_flops,
    ensure_countable,
    measure_forward,
    measure_generate,
    measure_train_step,
    relative_errors,
)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func._overloadpacket))
        return func(*args, **(kwargs or {}))


def _bare(fn) -> int:
    with FlopCounterMode(display=False) as c:
        fn()
    return c.get_total_flops()


def test_linear_is_2mkn():
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    assert count_flops(F.linear, x, w) == 2 * 5 * 7 * 3


def test_inplace_addmm_and_baddbmm_are_counted():
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    acc = torch.zeros(6, 5)
    assert _bare(lambda: acc.addmm_(a, b)) == 0  # torch 2.13's blind spot, filled below
    assert count_flops(lambda: acc.addmm_(a, b)) == 2 * 6 * 4 * 5
    ba, bb = torch.randn(3, 6, 4), torch.randn(3, 4, 5)
    bacc = torch.zeros(3, 6, 5)
    assert count_flops(lambda: bacc.baddbmm_(ba, bb)) == 2 * 3 * 6 * 4 * 5


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_cpu_fused_sdpa_forward_and_backward(kv_heads):
    b, h, s, d = 2, 4, 9, 8
    q = torch.randn(b, h, s, d, requires_grad=True)
    k = torch.randn(b, kv_heads, s, d, requires_grad=True)
    v = torch.randn(b, kv_heads, s, d, requires_grad=True)

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != h)

    with _Ops() as rec:
        fwd().sum().backward()
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in rec.ops
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward" in rec.ops
    assert _bare(fwd) == 0  # torch 2.13 counts the fused CPU kernel as 0

    unit = 2 * b * h * s * s * d  # one (s x d)(d x s) product per head
    assert count_flops(fwd) == 2 * unit  # QK^T + PV, full square (the causal flag is ignored)
    out = fwd()
    with Counter() as c:
        out.sum().backward()
    assert c.total == 4 * unit  # dP, dV, dQ, dK: 2x forward, as eager autograd
    out = fwd()
    with Counter(sdpa_backward="kernel") as c:
        out.sum().backward()
    assert c.total == 5 * unit  # plus the kernel's recompute of QK^T


def _tiny_pair(make_model, shape):
    return make_model(shape, "eager"), make_model(shape, "sdpa")


def test_sdpa_measures_as_eager(shape, make_model, make_batch):
    eager, sdpa = _tiny_pair(make_model, shape)
    ids, mask = make_batch(shape.vocab)
    lens = [ids.shape[1]] * ids.shape[0]
    with _Ops() as rec:
        sdpa(ids, attention_mask=mask)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in rec.ops
    for logits_to_keep in (0, 3):
        fe = measure_forward(eager, ids, mask, logits_to_keep)
        assert measure_forward(sdpa, ids, mask, logits_to_keep) == fe
        assert fe == forward_flops(shape, lens, logits=logits_to_keep, conventions="torch")
    te, ts = measure_train_step(eager, ids, mask), measure_train_step(sdpa, ids, mask)
    assert te.components == ts.components
    assert te.total == train_flops(shape, lens, conventions="torch")
    ge, gs = measure_generate(eager, ids, 4, mask), measure_generate(sdpa, ids, 4, mask)
    assert ge.components == gs.components
    assert ge.total == generate_flops(shape, lens, [4] * len(lens), conventions="torch")


@pytest.mark.parametrize("shape", ["gqa-untied-1L", "mha-tied-3L"], indirect=True)
def test_sdpa_lora(shape, make_model, make_lora, make_batch):
    """With every q/k/v adapted (or with input grads on) sdpa == eager == analytic. With a
    partial q/k/v set at layer 0 the fused kernel computes all three input gradients where
    eager autograd computes only those needed: sdpa measures (4 - n) more backward units
    at layer 0, n = eager's units (dQ, dK, dP, dV as needed)."""
    eager, sdpa = _tiny_pair(make_model, shape)
    ids, mask = make_batch(shape.vocab)
    lens = [ids.shape[1]] * ids.shape[0]
    for targets in (LAYER_MATRICES, ("gate_proj", "up_proj", "down_proj"), ("v_proj",)):
        me = measure_train_step(make_lora(eager, 2, targets), ids, mask)
        ms = measure_train_step(make_lora(sdpa, 2, targets), ids, mask)
        assert me.total == train_flops(shape, lens, lora=LoRA(2, targets), conventions="torch")
        unit = 2 * ids.shape[0] * ids.shape[1] ** 2 * shape.num_heads * shape.head_dim
        expected_extra = 3 * unit if targets == ("v_proj",) else 0  # eager: dV only at layer 0
        assert ms.forward == me.forward
        assert ms.backward - me.backward == expected_extra


def test_ensure_countable(make_model, make_batch):
    from race.accounting import ModelShape

    shape = ModelShape("t", num_layers=2, hidden=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate=48,
                       vocab=29)
    model = make_model(shape, "sdpa")
    assert ensure_countable(model) is model and attention_implementation(model) == "sdpa"  # already exact
    model.config._attn_implementation = "flex_attention"  # e.g. a config saved with a kernel the counter misses
    ensure_countable(model)
    assert attention_implementation(model) == "eager"
    ensure_countable(model, "sdpa")
    assert attention_implementation(model) == "sdpa"
    ids, mask = make_batch(shape.vocab)
    assert measure_forward(model, ids, mask) == forward_flops(shape, [13] * 3, conventions="torch")
    with pytest.raises(ValueError, match="eager and sdpa"):
        ensure_countable(model, "flash_attention_2")


def test_meter_keys_totals_and_ledger(tmp_path):
    meter = FlopMeter()
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with meter.phase("rollout/decode"):
        x @ w
    with meter.phase("rollout/decode"):
        x @ w
    with meter.phase("update/forward"):
        x @ w
        with meter.phase("update/backward"):  # nested: counted under both keys
            x @ w
    meter.add({"recompute/forward": 10, "reward/head": 5})
    one = 2 * 4 * 8 * 3
    assert meter.components == {"rollout/decode": 2 * one, "update/forward": 2 * one, "update/backward": one,
                                "recompute/forward": 10, "reward/head": 5}
    assert meter.phase_totals() == {"rollout": 2 * one, "update": 3 * one, "recompute": 10, "reward": 5}
    assert meter.total == 5 * one + 5  # recompute is hardware FLOPs, not model FLOPs
    assert meter.hardware_total == meter.total + 10
    assert set(meter.seconds) == {"rollout/decode", "update/forward", "update/backward"}
    with pytest.raises(ValueError, match="phase/component"):
        with meter.phase("rollout"):
            pass
    led = FlopLedger(tmp_path / "l.jsonl")
    meter.to_ledger(led, step=0)
    assert led.total == meter.total
    assert led.totals_by_phase()["recompute"] == 10
    assert FlopLedger.load(tmp_path / "l.jsonl").totals_by_key() == meter.components


def test_train_step_needs_something_trainable():
    lin = torch.nn.Linear(4, 4).requires_grad_(False)

    class Out:
        def __init__(self, t):
            self.logits = t

    model = lambda ids, **kw: Out(lin(ids))  # noqa: E731
    with pytest.raises(ValueError, match="trainable"):
        measure_train_step(model, torch.randn(2, 4))


def test_relative_errors():
    r = relative_errors({"a": 110, "b": 0, "c": 5}, {"a": 100, "b": 0, "d": 4})
    assert r == {"a": pytest.approx(0.1), "b": 0.0, "c": float("inf"), "d": -1.0}


@pytest.mark.parametrize("op", ["addmm", "bmm"])  # baddbmm.dtype has no working meta kernel to run
def test_overloads_with_an_extra_positional_argument_are_counted(op):
    """The ``.dtype`` overloads (``out_dtype``, positional) reach the counter on CUDA in
    bf16 runs; torch's own formulas take no extra positional argument and raise ("got
    multiple values for argument 'out_shape'", seen on an H200 with torch 2.11). Meta
    tensors run the overload on any machine; the count is the product's 2*m*k*n."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from race.measure import Counter

    aten, bf = torch.ops.aten, dict(device="meta", dtype=torch.bfloat16)
    if op == "addmm":
        args, want = (torch.empty(3, **bf), torch.empty(4, 8, **bf), torch.empty(8, 3, **bf)), 2 * 4 * 8 * 3
    else:
        args, want = (torch.empty(2, 4, 8, **bf), torch.empty(2, 8, 3, **bf)), 2 * 2 * 4 * 8 * 3
    overload = getattr(aten, op).dtype
    with pytest.raises(TypeError):  # what torch's own formula does (addmm/bmm: "multiple values for 'out_shape'")
        with FlopCounterMode(display=False):
            overload(*args, torch.float32)
    with Counter() as c:
        overload(*args, torch.float32)
    assert c.total == want
