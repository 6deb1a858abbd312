"""A functional Qwen2/Llama decoder for rollouts: the same math as the HF model, none of
its per-call overhead, and a preallocated KV cache.

At pilot-grid scale (tiny models on a CPU) a decode step of the HF model is almost all
Python overhead: mask construction, cache bookkeeping, output dataclasses, PEFT's
per-layer dispatch. This module reads the model's own parameters (live references, so
LoRA updates are seen at once) and runs the forward with few plain tensor ops:

- LoRA is applied as PEFT does, ``W x + b + (alpha/r) * B(A x)``, unless the rollout
  merges it (:meth:`FastDecoder.merge_lora`): then ``W' = W + (alpha/r) * B A`` is built
  once per rollout (one ``out x r x in`` matmul per adapted matrix, charged to the ledger
  as ``rollout/merge``) and every token runs one matmul per projection instead of three.
  The model's parameters are never changed: ``W'`` is a new tensor;
- with no live LoRA, q/k/v run as one matmul and gate/up as one (weights concatenated:
  the same FLOPs), the attention scale is folded into the q rows, RoPE reads a table;
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


@dataclass
class _Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None
    loras: list[tuple[torch.Tensor, torch.Tensor, float, float]]  # (A, B, scale, dropout p in training)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        for a, b, s, p in self.loras:
            xa = F.dropout(x, p) if p > 0 else x
            y = y + F.linear(F.linear(xa, a), b) * s
        return y

    def merged(self) -> "_Linear":
        """``W + s * B A`` as a new tensor (one matmul per adapter); the model is untouched."""
        w = self.weight
        for a, b, s, _ in self.loras:
            w = w + torch.matmul(b * s, a)
        return _Linear(w, self.bias, [])


def _linear(mod: Any) -> _Linear:
    """Weights of an ``nn.Linear`` or a PEFT LoRA layer (active, enabled adapters only);
    LoRA dropout applies when the layer is in training mode, as in PEFT."""
    base = getattr(mod, "base_layer", mod)
    loras: list[tuple[torch.Tensor, torch.Tensor, float, float]] = []
    if hasattr(mod, "lora_A") and not getattr(mod, "disable_adapters", False) and not getattr(mod, "merged", False):
        for name in mod.active_adapters:
            if name in mod.lora_A:
                drop = mod.lora_dropout[name] if name in getattr(mod, "lora_dropout", {}) else None
                p = float(drop.p) if isinstance(drop, torch.nn.Dropout) and drop.training else 0.0
                loras.append((mod.lora_A[name].weight, mod.lora_B[name].weight, float(mod.scaling[name]), p))
    return _Linear(base.weight, base.bias, loras)


def _fuse(parts: list[_Linear], scale_first: float = 1.0) -> _Linear:
    """One linear for several LoRA-free ones (rows concatenated; the first scaled)."""
    ws = [p.weight for p in parts]
    ws[0] = ws[0] * scale_first
    bias = None
    if any(p.bias is not None for p in parts):
        bs = [p.bias if p.bias is not None else torch.zeros(p.weight.shape[0], dtype=p.weight.dtype,
                                                            device=p.weight.device) for p in parts]
        bs[0] = bs[0] * scale_first
        bias = torch.cat(bs)
    return _Linear(torch.cat(ws), bias, [])


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
        self.layers: list[dict[str, Any]] = []
        for layer in inner.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                q=_linear(at.q_proj), k=_linear(at.k_proj), v=_linear(at.v_proj), o=_linear(at.o_proj),
                gate=_linear(mlp.gate_proj), up=_linear(mlp.up_proj), down=_linear(mlp.down_proj)))
        self._fuse_lora_free()
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
    def lora_dims(self) -> list[tuple[int, int, int]]:
        """(in, out, rank) of every live (unmerged) LoRA adapter."""
        return [(a.shape[1], b.shape[0], a.shape[0]) for L in self.layers for key in ("q", "k", "v", "o", "gate", "up",
                                                                                       "down")
                if isinstance(L.get(key), _Linear) for a, b, *_ in L[key].loras]

    def merge_pays(self, tokens: int) -> bool:
        """Whether merging costs fewer FLOPs than running the adapters over ``tokens``
        token positions: ``2 r in out`` once against ``2 r (in + out)`` per token."""
        dims = self.lora_dims()
        return bool(dims) and sum(i * o * r for i, o, r in dims) <= tokens * sum(r * (i + o) for i, o, r in dims)

    def merge_lora(self) -> None:
        """Fold every live adapter into a new weight (see module docstring)."""
        for L in self.layers:
            for key in ("q", "k", "v", "o", "gate", "up", "down"):
                if key in L and L[key].loras:
                    L[key] = L[key].merged()
        self._fuse_lora_free()

    def _fuse_lora_free(self) -> None:
        for L in self.layers:
            if "q" in L and not (L["q"].loras or L["k"].loras or L["v"].loras):
                L["qkv"] = _fuse([L.pop("q"), L.pop("k"), L.pop("v")], scale_first=self.scaling)
            if "gate" in L and not (L["gate"].loras or L["up"].loras):
                L["gate_up"] = _fuse([L.pop("gate"), L.pop("up")])

    # -- forward --------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x.to(dt)

    def _tables(self, max_len: int, device: Any, dtype: torch.dtype) -> None:
        """cos and sign-folded sin per position: ``rope(x) = x cos + roll(x, d/2) sin±``."""
        pos = torch.arange(max_len, device=device)
        freqs = pos[:, None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half, device=device), torch.ones(self.head_dim - half, device=device)])
        self.cos = (emb.cos() * self.rope_scale).to(dtype)
        self.sin = (emb.sin() * self.rope_scale * sign).to(dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.roll(x, self.head_dim // 2, dims=-1) * sin

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (B, n) at cache offset ``self.length``; ``bias`` (B, 1, n, keys) is
        added to the attention scores. Returns last-position logits."""
        B, n = ids.shape
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        rep = H // KV
        start, end = self.length, self.length + n
        x = F.embedding(ids, self.embed, self.padding_idx)
        assert self.cos is not None and self.sin is not None
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # (B, n, 1, hd)
        bias = bias[:, :, None]  # (B, 1, 1, n, keys): broadcast over (kv head, rep)
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["ln1"])
            if "qkv" in L:  # q rows carry the attention scale
                qkv = L["qkv"](h).view(B, n, H + 2 * KV, hd)
                qk = self._rope(qkv[:, :, :H + KV], cos, sin)
                q, k, v = qk[:, :, :H], qk[:, :, H:], qkv[:, :, H + KV:]
            else:
                q = self._rope(L["q"](h).view(B, n, H, hd), cos, sin) * self.scaling
                k = self._rope(L["k"](h).view(B, n, KV, hd), cos, sin)
                v = L["v"](h).view(B, n, KV, hd)
            self.k_cache[li][:, :, start:end] = k.transpose(1, 2)
            self.v_cache[li][:, :, start:end] = v.transpose(1, 2)
            K, V = self.k_cache[li][:, :, :end], self.v_cache[li][:, :, :end]
            q = q.reshape(B, n, KV, rep, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, rep * n, hd)
            scores = torch.matmul(q, K.transpose(2, 3)).view(B, KV, rep, n, end) + bias
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype).view(B, KV, rep * n, end)
            a = torch.matmul(p, V).view(B, KV, rep, n, hd).permute(0, 3, 1, 2, 4).reshape(B, n, H * hd)
            x = x + L["o"](a)
            h = self._rms(x, L["ln2"])
            if "gate_up" in L:
                g, u = L["gate_up"](h).chunk(2, dim=-1)
            else:
                g, u = L["gate"](h), L["up"](h)
            x = x + L["down"](F.silu(g) * u)
        self.length = end
        x = self._rms(x[:, -1:], self.norm_w)
        return F.linear(x, self.lm_head)[:, -1]

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
        """Allocate the cache for ``max_len`` positions and run the (left-padded) prompts."""
        B, P = ids.shape
        dev, dt = ids.device, self.embed.dtype
        shape = (B, self.kv_heads, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers]
        self._tables(max_len, dev, dt)
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

    @torch.no_grad()
    def decode(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One new token per row at position ``pos`` (B,); returns its logits (B, V)."""
        assert self.bias is not None
        self.bias[:, self.length] = 0.0
        return self._forward(tok[:, None], pos[:, None], self.bias[:, None, None, : self.length + 1])
