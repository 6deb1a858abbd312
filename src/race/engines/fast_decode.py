"""A functional Qwen2/Llama decoder for rollouts: the same math as the HF model, none of
its per-call overhead, and a preallocated KV cache.

At pilot-grid scale (tiny models on a CPU) a decode step of the HF model is almost all
Python overhead: mask construction, cache bookkeeping, output dataclasses, PEFT's
per-layer dispatch. This module reads the model's own parameters (live references, so
LoRA updates are seen at once; nothing is copied or merged) and runs the forward with
plain tensor ops:

- LoRA is applied as PEFT does, ``W x + b + (alpha/r) * B(A x)`` (no merge), so the FLOPs
  are exactly ``race.accounting``'s forward with LoRA;
- the KV cache is one preallocated tensor per layer; decode attends over the filled
  prefix only (``c + 1`` keys for a token with ``c`` cached), as ``generate_flops`` counts;
- attention is explicit ``q @ k^T`` / ``p @ v`` matmuls (visible to FlopCounterMode),
  grouped-query heads expanded as HF's eager ``repeat_kv`` does.

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
    loras: list[tuple[torch.Tensor, torch.Tensor, float]]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        for a, b, s in self.loras:
            y = y + F.linear(F.linear(x, a), b) * s
        return y


def _linear(mod: Any) -> _Linear:
    """Weights of an ``nn.Linear`` or a PEFT LoRA layer (active, enabled adapters only)."""
    base = getattr(mod, "base_layer", mod)
    loras: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    if hasattr(mod, "lora_A") and not getattr(mod, "disable_adapters", False) and not getattr(mod, "merged", False):
        for name in mod.active_adapters:
            if name in mod.lora_A:
                loras.append((mod.lora_A[name].weight, mod.lora_B[name].weight, float(mod.scaling[name])))
    return _Linear(base.weight, base.bias, loras)


class FastDecoder:
    """Prefill + cached decode over a causal LM's parameters (see module docstring)."""

    def __init__(self, model: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        self.cfg = cfg
        inner = base.model
        self.embed = inner.embed_tokens.weight
        self.lm_head = base.lm_head.weight
        self.norm_w, self.eps = inner.norm.weight, float(cfg.rms_norm_eps)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.scaling = self.head_dim ** -0.5
        rot = inner.rotary_emb
        self.inv_freq, self.rope_scale = rot.inv_freq, float(getattr(rot, "attention_scaling", 1.0))
        self.layers = []
        for layer in inner.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                q=_linear(at.q_proj), k=_linear(at.k_proj), v=_linear(at.v_proj), o=_linear(at.o_proj),
                gate=_linear(mlp.gate_proj), up=_linear(mlp.up_proj), down=_linear(mlp.down_proj)))
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.key_ok: torch.Tensor | None = None
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

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x.to(dt)

    def _rope(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (B, n) at cache offset ``self.length``; returns last-position logits."""
        B, n = ids.shape
        start, end = self.length, self.length + n
        x = F.embedding(ids, self.embed)
        cos, sin = self._rope(pos, x.dtype)
        cos, sin = cos[:, None], sin[:, None]
        rep = self.heads // self.kv_heads
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["ln1"])
            q = L["q"](h).view(B, n, self.heads, self.head_dim).transpose(1, 2)
            k = L["k"](h).view(B, n, self.kv_heads, self.head_dim).transpose(1, 2)
            v = L["v"](h).view(B, n, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            self.k_cache[li][:, :, start:end] = k
            self.v_cache[li][:, :, start:end] = v
            K, V = self.k_cache[li][:, :, :end], self.v_cache[li][:, :, :end]
            if rep > 1:
                K, V = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
            scores = torch.matmul(q, K.transpose(2, 3)) * self.scaling + bias
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            a = torch.matmul(p, V).transpose(1, 2).reshape(B, n, self.heads * self.head_dim)
            x = x + L["o"](a)
            h = self._rms(x, L["ln2"])
            x = x + L["down"](F.silu(L["gate"](h)) * L["up"](h))
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
        self.key_ok = torch.zeros(B, max_len, dtype=torch.bool, device=dev)
        self.key_ok[:, :P] = mask.bool()
        self.length = 0
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        allowed = causal[None, None] & self.key_ok[:, None, None, :P]
        bias = torch.zeros(allowed.shape, dtype=dt, device=dev).masked_fill(~allowed, torch.finfo(dt).min)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return self._forward(ids, pos, bias)

    def expand(self, group: int) -> None:
        """Repeat every cached row ``group`` times (the G samples share the prompt)."""
        if group == 1:
            return
        self.k_cache = [c.repeat_interleave(group, dim=0) for c in self.k_cache]
        self.v_cache = [c.repeat_interleave(group, dim=0) for c in self.v_cache]
        assert self.key_ok is not None
        self.key_ok = self.key_ok.repeat_interleave(group, dim=0)

    @torch.no_grad()
    def decode(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One new token per row at position ``pos`` (B,); returns its logits (B, V)."""
        assert self.key_ok is not None
        self.key_ok[:, self.length] = True
        ok = self.key_ok[:, None, None, : self.length + 1]
        dt = self.embed.dtype
        bias = torch.zeros(ok.shape, dtype=dt, device=tok.device).masked_fill(~ok, torch.finfo(dt).min)
        return self._forward(tok[:, None], pos[:, None], bias)
