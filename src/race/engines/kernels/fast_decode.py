"""A functional Qwen2/Llama decoder for rollouts: the same math as the HF model, none of
its per-call overhead, and a preallocated KV cache.

At pilot-grid scale (tiny models on a CPU) a decode step of the HF model is almost all
Python overhead: mask construction, cache bookkeeping, output dataclasses, PEFT's
per-layer dispatch. This module reads the model's own parameters (live references, so
LoRA updates are seen at once) and runs the forward with few plain tensor ops:

- LoRA is applied as PEFT does, ``W x + b + (alpha/r) * B(A dropout(x))``, unless the
  rollout merges it (:meth:`FastDecoder.merge_lora`): then ``W' = W + (alpha/r) * B A`` is
  built once per rollout (one ``out x r x in`` matmul per adapted matrix, charged to the
  ledger as ``rollout/merge``) and every token runs one matmul per projection instead of
  three. The model's parameters are never changed: ``W'`` is a new tensor. ``W'`` is in the
  base weights' dtype, so a merge is allowed only where that dtype holds the delta
  (:func:`fold_keeps_update`: float32 or wider). A bfloat16/float16 base rounds every
  delta below half a unit in the last place of its weight away (bf16 keeps 8 significant
  bits: a LoRA update after one Adam step at lr 1e-4 on SmolLM2-135M changed 1.8% of a
  layer's weights and kept 4% of the update), while the learning passes run the adapters
  live in float32; there the rollout runs the adapters live too, the training forward's
  own ops, so the policy that samples is the one whose log-probs are trained;
- projections of one input run in few matmuls (:class:`_Proj`): q/k/v as one over their
  concatenated weights, gate/up as one, the adapters' A matrices as one, each B as an
  ``addmm`` into its output, the residual adds inside o's and down's ``addmm``: the same
  FLOPs as separate layers, forward and backward. The attention scale is folded into the
  q rows, RoPE reads a table;
- the KV cache is one preallocated tensor per layer; decode attends over the filled
  prefix only (``c + 1`` keys for a token with ``c`` cached), as ``generate_flops`` counts;
- attention is explicit ``q @ k^T`` / ``p @ v`` matmuls (visible to FlopCounterMode);
  grouped-query heads attend to their shared key/value head without copying it (the
  matmul FLOPs are HF's eager ``repeat_kv`` ones).

Supported: ``Qwen2ForCausalLM`` and Llama/Mistral-style models without sliding windows,
default RoPE. Anything else falls back to the HF forward (``FastDecoder.supports``).
Tests check logits against the HF model and FLOPs against the analytic count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_SUPPORTED = ("qwen2", "llama", "mistral")


def linear_add(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               add: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias) (+ add)``: one ``addmm`` when there is an ``add`` (a LoRA
    delta) and no bias, so the sum costs no extra pass over the output."""
    if add is not None and bias is None:
        return torch.addmm(add, x, weight.t())
    y = F.linear(x, weight, bias)
    return y if add is None else y + add


@dataclass
class _Adapter:
    a: torch.Tensor  # (r, in)
    b: torch.Tensor  # (out, r)
    scale: float  # alpha / r
    dropout: float  # PEFT's lora_dropout p while the layer trains, else 0


@dataclass
class _Spec:
    """One projection of the model: its live weights and adapters."""
    weight: torch.Tensor
    bias: torch.Tensor | None
    adapters: list[_Adapter]


def fold_keeps_update(model: Any) -> bool:
    """Whether folding ``model``'s LoRA adapters into its base weights keeps their
    update (module docstring): every adapted base weight is float32 or wider. A
    bfloat16/float16 weight has 8/11 significant bits: ``W + s B A`` rounded to it loses
    every delta below half its unit in the last place, which a small update is (the
    adapters themselves are float32 over a half-precision base: PEFT's
    ``autocast_adapter_dtype``). A model without adapters has nothing to fold (True)."""
    for mod in model.modules():
        if hasattr(mod, "lora_A") and hasattr(mod, "base_layer") and len(mod.lora_A):
            if not _holds_fold(mod.base_layer.weight.dtype):
                return False
    return True


def _holds_fold(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and torch.finfo(dtype).eps <= torch.finfo(torch.float32).eps


def _spec(mod: Any) -> _Spec:
    """Weights of an ``nn.Linear`` or a PEFT LoRA layer (active, enabled adapters only);
    LoRA dropout applies when the layer is in training mode, as in PEFT."""
    base = getattr(mod, "base_layer", mod)
    ads: list[_Adapter] = []
    if hasattr(mod, "lora_A") and not getattr(mod, "disable_adapters", False) and not getattr(mod, "merged", False):
        for name in mod.active_adapters:
            if name in mod.lora_A:
                drop = mod.lora_dropout[name] if name in getattr(mod, "lora_dropout", {}) else None
                p = float(drop.p) if isinstance(drop, torch.nn.Dropout) and drop.training else 0.0
                ads.append(_Adapter(mod.lora_A[name].weight, mod.lora_B[name].weight, float(mod.scaling[name]), p))
    return _Spec(base.weight, base.bias, ads)


class _Proj:
    """Projections of one input (q/k/v, gate/up, or one alone) in few matmuls, FLOP for
    FLOP what separate PEFT layers execute, forward and backward: the base weights
    concatenated (one matmul), the adapters' A matrices concatenated (one matmul, unless
    dropout needs a mask per adapter), then one ``addmm`` per adapter's B into its output.
    ``scales`` multiply a member's whole output (the attention scale folded into q);
    ``merge`` folds the adapters into new weights first (``W + s B A``: one matmul each)."""

    def __init__(self, specs: list[_Spec], scales: list[float] | None = None, *, merge: bool = False) -> None:
        scales = scales or [1.0] * len(specs)
        ws, bs, self.adapters = [], [], []
        for sp, sc in zip(specs, scales):
            w, ads = sp.weight, sp.adapters
            if merge:
                for ad in ads:  # in the adapter's dtype (PEFT keeps it fp32 over a bf16 base), then the base's
                    w = (w + torch.matmul(ad.b * ad.scale, ad.a)).to(sp.weight.dtype)
                ads = []
            ws.append(w * sc if sc != 1.0 else w)
            bs.append(None if sp.bias is None else (sp.bias * sc if sc != 1.0 else sp.bias))
            self.adapters.append([_Adapter(ad.a, ad.b, ad.scale * sc, ad.dropout) for ad in ads])
        self.sizes = [w.shape[0] for w in ws]
        self.weight = ws[0] if len(ws) == 1 else torch.cat(ws)
        self.bias = None
        if any(b is not None for b in bs):
            self.bias = torch.cat([b if b is not None else torch.zeros(n, dtype=self.weight.dtype,
                                                                       device=self.weight.device)
                                   for b, n in zip(bs, self.sizes)])
        flat = [ad for ads in self.adapters for ad in ads]
        self.plain = not flat  # no live adapter: one matmul does it all
        self.a_cat = torch.cat([ad.a for ad in flat]) if len(flat) > 1 and not any(ad.dropout for ad in flat) else None

    def __call__(self, x: torch.Tensor, add: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Outputs per member for 2-D ``x``; ``add`` (one member only) is added to it."""
        y = linear_add(x, self.weight, self.bias, add)
        outs = list(y.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [y]
        return self.add_adapters(x, outs)

    def add_adapters(self, x: torch.Tensor, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``outs`` (the base outputs for ``x``, one per member) plus each live adapter's
        branch, as PEFT adds it: ``x`` cast to the adapter's dtype (PEFT keeps adapters
        fp32 over a bf16 base), the branch in that dtype, the sum cast back to the base's."""
        flat = [(i, ad) for i, ads in enumerate(self.adapters) for ad in ads]
        if not flat:
            return outs
        xl = x if x.dtype == flat[0][1].a.dtype else x.to(flat[0][1].a.dtype)  # PEFT casts x to the adapter's dtype
        if self.a_cat is not None:
            xas = F.linear(xl, self.a_cat).split([ad.a.shape[0] for _, ad in flat], dim=-1)
        else:
            xas = [F.linear(F.dropout(xl, ad.dropout) if ad.dropout else xl, ad.a) for _, ad in flat]
        for (i, ad), xa in zip(flat, xas):
            if outs[i].dtype == xa.dtype:
                outs[i] = torch.addmm(outs[i], xa, (ad.b * ad.scale).t())
            else:  # as PEFT: the base output plus the adapter branch in the adapter's dtype, cast back
                outs[i] = (outs[i] + torch.matmul(xa, (ad.b * ad.scale).t())).to(outs[i].dtype)
        return outs


class FastDecoder:
    """Prefill + cached decode over a causal LM's parameters (see module docstring)."""

    def __init__(self, model: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        self.cfg = cfg
        inner = base.model
        self.embed = inner.embed_tokens.weight
        self.padding_idx = getattr(inner.embed_tokens, "padding_idx", None)  # its row gets no gradient (HF's)
        self.lm_head = base.lm_head.weight
        self.norm_w, self.eps = inner.norm.weight, float(cfg.rms_norm_eps)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.scaling = self.head_dim ** -0.5
        rot = inner.rotary_emb
        self.inv_freq, self.rope_scale = rot.inv_freq, float(getattr(rot, "attention_scaling", 1.0))
        self.specs: list[dict[str, Any]] = []
        for layer in inner.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.specs.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                qkv=[_spec(at.q_proj), _spec(at.k_proj), _spec(at.v_proj)], o=[_spec(at.o_proj)],
                gate_up=[_spec(mlp.gate_proj), _spec(mlp.up_proj)], down=[_spec(mlp.down_proj)]))
        self.merged = False
        self._build()
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.bias: torch.Tensor | None = None  # (B, max_len): 0 on keys a row may attend to, else -inf-ish
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        self.length = 0

    @staticmethod
    def supports(model: Any) -> bool:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = getattr(base, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in _SUPPORTED:
            return False
        if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral" and cfg.sliding_window):
            return False
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", "default") not in ("default", None):
            return False
        return getattr(cfg, "hidden_act", "silu") == "silu" and hasattr(base, "lm_head")

    # -- LoRA merge ---------------------------------------------------------------------
    def _build(self) -> None:
        m = self.merged
        self.layers = [dict(ln1=sp["ln1"], ln2=sp["ln2"], qkv=_Proj(sp["qkv"], [self.scaling, 1.0, 1.0], merge=m),
                            o=_Proj(sp["o"], merge=m), gate_up=_Proj(sp["gate_up"], merge=m),
                            down=_Proj(sp["down"], merge=m)) for sp in self.specs]

    def lora_dims(self) -> list[tuple[int, int, int]]:
        """(in, out, rank) of every adapter the forward runs live (none once merged)."""
        if self.merged:
            return []
        return [(ad.a.shape[1], ad.b.shape[0], ad.a.shape[0]) for sp in self.specs
                for key in ("qkv", "o", "gate_up", "down") for s in sp[key] for ad in s.adapters]

    def merge_pays(self, tokens: int) -> bool:
        """Whether merging costs fewer FLOPs than running the adapters over ``tokens``
        token positions: ``2 r in out`` once against ``2 r (in + out)`` per token."""
        dims = self.lora_dims()
        return bool(dims) and sum(i * o * r for i, o, r in dims) <= tokens * sum(r * (i + o) for i, o, r in dims)

    def merge_keeps_update(self) -> bool:
        """Whether the weights of every live adapter's projection hold a folded delta
        (:func:`fold_keeps_update`: float32 or wider)."""
        return all(_holds_fold(s.weight.dtype) for sp in self.specs for key in ("qkv", "o", "gate_up", "down")
                   for s in sp[key] if s.adapters)

    def should_merge(self, tokens: int) -> bool:
        """The rollout's rule: merge when the base weights hold the delta
        (:meth:`merge_keeps_update`) and merging costs fewer FLOPs than the live adapters
        over ``tokens`` positions (:meth:`merge_pays`)."""
        return self.merge_keeps_update() and self.merge_pays(tokens)

    def merge_lora(self) -> None:
        """Fold every live adapter into new weights (see module docstring); refused where
        the base weights' dtype would round the update away (:meth:`merge_keeps_update`)."""
        if self.lora_dims():
            if not self.merge_keeps_update():
                dts = sorted({str(s.weight.dtype) for sp in self.specs for key in ("qkv", "o", "gate_up", "down")
                              for s in sp[key] if s.adapters})
                raise ValueError(f"merging LoRA into base weights of dtype {', '.join(dts)} rounds the adapters' "
                                 "update away (deltas below half a unit in the last place of each weight are lost): "
                                 "run the adapters live (merge_lora=False) or load the base in float32")
            self.merged = True
            self._build()

    # -- forward --------------------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op, HF's Qwen2RMSNorm arithmetic
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x.to(dt)

    def rope_tables(self, max_len: int, device: Any, dtype: torch.dtype) -> None:
        """cos and sign-folded sin per position: ``rope(x) = x cos + roll(x, d/2) sin±``."""
        pos = torch.arange(max_len, device=device)
        freqs = pos[:, None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half, device=device), torch.ones(self.head_dim - half, device=device)])
        self.cos = (emb.cos() * self.rope_scale).to(dtype)
        self.sin = (emb.sin() * self.rope_scale * sign).to(dtype)

    def apply_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.roll(x, self.head_dim // 2, dims=-1) * sin

    def run(self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor, keys: Any) -> torch.Tensor:
        """The decoder layers over ``ids`` (B, n) at positions ``pos``; returns the final
        hidden states (B, n, h) before the last norm. ``bias`` (B, 1, n, keys) is added to
        the attention scores; ``keys(li, k, v)`` gives the (B, KV, keys, hd) keys and
        values layer ``li`` attends to, given this block's (B, n, KV, hd) ones."""
        B, n = ids.shape
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        rep = H // KV
        assert self.cos is not None and self.sin is not None
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # (B, n, 1, hd)
        bias = bias[:, :, None]  # (B, 1, 1, n, keys): broadcast over (kv head, rep)
        x = F.embedding(ids, self.embed, self.padding_idx).view(B * n, -1)
        for li, L in enumerate(self.layers):
            qkv, h = L["qkv"], self.rms_norm(x, L["ln1"])  # q carries the attention scale
            if qkv.plain:  # q and k adjacent in one output: one RoPE over both
                y = F.linear(h, qkv.weight, qkv.bias)
                qk = self.apply_rope(y[:, :(H + KV) * hd].view(B, n, H + KV, hd), cos, sin)
                q, k, v = qk[:, :, :H], qk[:, :, H:], y[:, (H + KV) * hd:]
            else:
                q, k, v = qkv(h)
                q = self.apply_rope(q.view(B, n, H, hd), cos, sin)
                k = self.apply_rope(k.view(B, n, KV, hd), cos, sin)
            K, V = keys(li, k, v.view(B, n, KV, hd))
            end = K.shape[2]
            q = q.reshape(B, n, KV, rep, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, rep * n, hd)
            scores = torch.matmul(q, K.transpose(2, 3)).view(B, KV, rep, n, end) + bias
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype).view(B, KV, rep * n, end)
            a = torch.matmul(p, V).view(B, KV, rep, n, hd).permute(0, 3, 1, 2, 4).reshape(B * n, H * hd)
            (x,) = L["o"](a, add=x)
            g, u = L["gate_up"](self.rms_norm(x, L["ln2"]))
            (x,) = L["down"](F.silu(g) * u, add=x)
        return x.view(B, n, -1)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (B, n) at cache offset ``self.length``; returns last-position logits."""
        start, end = self.length, self.length + ids.shape[1]

        def cached(li: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.k_cache[li][:, :, start:end] = k.transpose(1, 2)
            self.v_cache[li][:, :, start:end] = v.transpose(1, 2)
            return self.k_cache[li][:, :, :end], self.v_cache[li][:, :, :end]

        x = self.run(ids, pos, bias, cached)
        self.length = end
        return F.linear(self.rms_norm(x[:, -1], self.norm_w), self.lm_head)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
        """Allocate the cache for ``max_len`` positions and run the (left-padded) prompts."""
        B, P = ids.shape
        dev, dt = ids.device, self.embed.dtype
        shape = (B, self.kv_heads, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers]
        self.rope_tables(max_len, dev, dt)
        neg = torch.finfo(dt).min
        self.bias = torch.full((B, max_len), neg, dtype=dt, device=dev)
        self.bias[:, :P].masked_fill_(mask.bool(), 0.0)
        self.length = 0
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        allowed = causal[None, None] & mask.bool()[:, None, None, :]
        bias = torch.zeros(allowed.shape, dtype=dt, device=dev).masked_fill(~allowed, neg)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return self._forward(ids, pos, bias)

    def expand(self, group: int) -> None:
        """Repeat every cached row ``group`` times (the G samples share the prompt)."""
        if group == 1:
            return
        self.k_cache = [c.repeat_interleave(group, dim=0) for c in self.k_cache]
        self.v_cache = [c.repeat_interleave(group, dim=0) for c in self.v_cache]
        assert self.bias is not None
        self.bias = self.bias.repeat_interleave(group, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only cache rows ``rows`` (finished rows leave the batch)."""
        self.k_cache = [c.index_select(0, rows) for c in self.k_cache]
        self.v_cache = [c.index_select(0, rows) for c in self.v_cache]
        assert self.bias is not None
        self.bias = self.bias.index_select(0, rows)

    @torch.no_grad()
    def decode(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One new token per row at position ``pos`` (B,); returns its logits (B, V)."""
        assert self.bias is not None
        self.bias[:, self.length] = 0.0
        return self._forward(tok[:, None], pos[:, None], self.bias[:, None, None, : self.length + 1])
