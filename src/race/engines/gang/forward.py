"""The batched multi-LoRA forward: many members' rows over one frozen base.

A gang is K LoRA policies over the same base weights. Each pass of the gang runs one
*segment* per member (its own rows, its own padded width, its own positions and masks),
and every decoder layer is executed with:

- the base projections as one matmul over the tokens of several segments (rows
  concatenated, ``(sum_m B_m n_m, in) x (in, out)``), since the frozen base weight is the
  same for all: consecutive segments share one matmul while their rows add up to at most
  ``shared_rows`` (``SHARED_ROWS`` on a CPU; no cap on an accelerator); a segment with
  more rows runs its own, the solo pass's matmul. On a CPU a matmul of a thousand rows
  already runs at the BLAS's rate for these shapes, and concatenating more only adds
  copies (forward and backward) and a working set past the cache: measured at the demo's
  shapes (``benchmarks/engine_speed.py --gang``), an uncapped update ran 1.16x slower
  than the members' solo updates;
- each member's LoRA delta on its own contiguous slice of those rows, exactly as the
  solo functional forward adds it (``race.engines.kernels.fast_decode._Proj``: the member's A
  matrices as one matmul, then one ``addmm`` per B into its output slice); a segment with
  no member (``member=None``) runs the base alone (the reference policy, adapter off);
- attention per segment (its own keys, values and mask), as the solo forward runs it.

So each member's rows execute exactly the matmuls its solo pass executes (the base matmul
is the solo's over more rows), forward and backward: the FLOPs of a gang pass are the sum
of its members' solo passes, and each member's logits and gradients are its solo pass's
up to the float rounding of a matmul over a different number of rows (BLAS blocking; the
k-reduction of one output element may be split differently).

``GangDecoder`` builds the layer table once per pass from the members' live parameters
(gradients reach each member's own adapter); ``shared_prompt_logits`` is the gang form of
``race.engines.kernels.fast_forward.shared_prompt_logits`` (each prompt once per group and
micro-batch, completions over its keys and values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from race.engines.kernels.fast_decode import FastDecoder, linear_add
from race.engines.kernels.fast_forward import padding_bias

KeysFn = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

#: Most rows one shared base matmul covers on a CPU (module docstring).
SHARED_ROWS = 512


@dataclass
class Segment:
    """One member's block of a gang pass: ``ids``/``pos`` (B, n), ``bias`` (B, 1, n, keys)
    added to its attention scores, ``keys(li, k, v)`` its keys/values at layer ``li``
    (as ``FastDecoder.run``); ``member``: whose adapter runs (None: the base alone)."""

    ids: torch.Tensor
    pos: torch.Tensor
    bias: torch.Tensor
    keys: KeysFn
    member: int | None


class GangDecoder:
    """The layers of K members over one base (module docstring). ``models``: the members'
    (PEFT) policies; their base weights must be equal (``share_base``)."""

    def __init__(self, models: list[Any], shared_rows: int | None = -1) -> None:
        self.decs = [FastDecoder(m) for m in models]
        self.base = self.decs[0]
        if shared_rows == -1:  # the default: capped on a CPU only
            shared_rows = None if self.base.embed.device.type != "cpu" else SHARED_ROWS
        if shared_rows is not None and shared_rows < 1:
            raise ValueError(f"shared_rows={shared_rows}: must be >= 1 (or None: no cap)")
        self.shared_rows = shared_rows

    def _groups(self, xs: list[torch.Tensor]) -> list[list[int]]:
        """Segments sharing one base matmul: those whose inputs need a gradient alike (a
        row whose solo pass needs no input gradient must not get one here), consecutive,
        while their rows add up to at most ``shared_rows``."""
        out: list[list[int]] = []
        for grad in (False, True):
            cur: list[int] = []
            n = 0
            for k, x in enumerate(xs):
                if bool(x.requires_grad) != grad:
                    continue
                if cur and self.shared_rows is not None and n + x.shape[0] > self.shared_rows:
                    out.append(cur)
                    cur, n = [], 0
                cur.append(k)
                n += x.shape[0]
            if cur:
                out.append(cur)
        return out

    def __getattr__(self, name: str) -> Any:  # embed, norm_w, lm_head, heads, ... of the shared base
        return getattr(self.__dict__["base"], name)

    def _proj(self, li: int, key: str, xs: list[torch.Tensor], segs: list[Segment],
              adds: list[torch.Tensor] | None = None) -> list[list[torch.Tensor]]:
        """Each segment's outputs of projection ``key`` at layer ``li`` for its 2-D input
        ``xs[k]`` (plus ``adds[k]``, the residual): the base matmul once per group of
        segments (``_groups``), then each segment's member's adapters on its own rows, as
        ``fast_decode._Proj`` adds them."""
        base = self.base.layers[li][key]
        out: list[list[torch.Tensor]] = [[] for _ in segs]
        for idx in self._groups(xs):
            x = torch.cat([xs[k] for k in idx]) if len(idx) > 1 else xs[idx[0]]
            add = None if adds is None else (torch.cat([adds[k] for k in idx]) if len(idx) > 1 else adds[idx[0]])
            y = linear_add(x, base.weight, base.bias, add)
            # rows per member by one split (its backward is one cat; slicing each member's rows
            # out would zero-fill a full-size gradient per member), then its parts (q/k/v, ...)
            rows = y.split([xs[k].shape[0] for k in idx], dim=0) if len(idx) > 1 else (y,)
            for k, yk in zip(idx, rows):
                mine = list(yk.split(base.sizes, dim=-1)) if len(base.sizes) > 1 else [yk]
                s = segs[k]
                p = None if s.member is None else self.decs[s.member].layers[li][key]
                if p is not None and not p.plain:
                    mine = p.add_adapters(xs[k], mine)
                out[k] = mine
        return out

    def run(self, segs: list[Segment]) -> list[torch.Tensor]:
        """The decoder layers over every segment; returns each segment's final hidden
        states (B, n, h) before the last norm (``FastDecoder.run`` per segment)."""
        b = self.base
        H, KV, hd = b.heads, b.kv_heads, b.head_dim
        rep = H // KV
        assert b.cos is not None and b.sin is not None
        rope = [(b.cos[s.pos][:, :, None], b.sin[s.pos][:, :, None]) for s in segs]
        xs = [F.embedding(s.ids, b.embed, b.padding_idx).view(s.ids.numel(), -1) for s in segs]
        for li, L in enumerate(b.layers):
            qkv = self._proj(li, "qkv", [b.rms_norm(x, L["ln1"]) for x in xs], segs)
            att = []
            for s, (q, k, v), (cos, sin) in zip(segs, qkv, rope):
                B, n = s.ids.shape
                q = b.apply_rope(q.view(B, n, H, hd), cos, sin)
                k = b.apply_rope(k.view(B, n, KV, hd), cos, sin)
                K, V = s.keys(li, k, v.view(B, n, KV, hd))
                end = K.shape[2]
                q = q.reshape(B, n, KV, rep, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, rep * n, hd)
                scores = torch.matmul(q, K.transpose(2, 3)).view(B, KV, rep, n, end) + s.bias[:, :, None]
                p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype).view(B, KV, rep * n, end)
                att.append(torch.matmul(p, V).view(B, KV, rep, n, hd).permute(0, 3, 1, 2, 4).reshape(B * n, H * hd))
            xs = [o for (o,) in self._proj(li, "o", att, segs, adds=xs)]
            gu = self._proj(li, "gate_up", [b.rms_norm(x, L["ln2"]) for x in xs], segs)
            xs = [o for (o,) in self._proj(li, "down", [F.silu(g) * u for g, u in gu], segs, adds=xs)]
        return [x.view(s.ids.shape[0], s.ids.shape[1], -1) for s, x in zip(segs, xs)]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.base.rms_norm(x, self.base.norm_w), self.base.lm_head)


def share_base(models: list[Any]) -> None:
    """Make every member's frozen weights member 0's tensors (one base in memory); refuse
    members whose frozen weights differ (a gang runs one base for all)."""
    def frozen(m: Any) -> dict[str, tuple[str, torch.Tensor]]:
        return {n.replace(".base_layer", ""): (n, p) for n, p in m.named_parameters(remove_duplicate=False)
                if not p.requires_grad}

    ref = frozen(models[0])
    for i, m in enumerate(models[1:], 1):
        mine = frozen(m)
        if mine.keys() != ref.keys() or any(not torch.equal(mine[k][1], ref[k][1]) for k in ref):
            raise ValueError(f"gang member {i} does not start from member 0's base weights: a gang shares one "
                             "frozen base; run it alone (gang: false) or give the members the same model")
        for k, (name, _) in mine.items():
            mod, _, attr = name.rpartition(".")
            m.get_submodule(mod)._parameters[attr] = ref[k][1]


@dataclass
class SharedItem:
    """One member's micro-batch of a prefix-shared pass (``fast_forward.shared_prompt_logits``'s
    arguments): S distinct prompts, B completions, ``seg`` (B,) each completion's prompt."""

    member: int | None
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    seg: torch.Tensor


def shared_prompt_logits(gdec: GangDecoder, items: list[SharedItem]) -> list[torch.Tensor]:
    """Each item's logits (B, T, V) predicting its completion tokens 1..T, all items in two
    gang passes (prompts, then completions over their prompts' keys and values): the gang
    form of ``race.engines.kernels.fast_forward.shared_prompt_logits``, same positions and masks."""
    dt, dev = gdec.embed.dtype, items[0].prompt_ids.device
    prep = []
    top = 0
    for it in items:
        p_pos = (it.prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        n_real = it.prompt_mask.long().sum(-1)[it.seg]
        T = it.completion_ids.shape[1]
        c_mask = it.completion_mask[:, :T - 1]
        c_pos = (n_real[:, None] + c_mask.long().cumsum(-1) - 1).clamp(min=0)
        top = max(top, int(p_pos.max()), int(c_pos.max()) if T > 1 else 0)
        prep.append((p_pos, c_pos, c_mask))
    gdec.base.rope_tables(top + 1, dev, dt)
    caches: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in items]

    def keeper(cache: list[tuple[torch.Tensor, torch.Tensor]]) -> KeysFn:
        def keep(li: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kv = (k.transpose(1, 2), v.transpose(1, 2))
            cache.append(kv)
            return kv
        return keep

    segs = []
    for it, (p_pos, _, _), cache in zip(items, prep, caches):
        P = it.prompt_ids.shape[1]
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        bias = padding_bias(causal[None] & it.prompt_mask.bool()[:, None, :], dt)
        segs.append(Segment(it.prompt_ids, p_pos, bias[:, None], keeper(cache), it.member))
    xs = gdec.run(segs)
    firsts = [gdec.head(x[:, -1])[it.seg][:, None] for x, it in zip(xs, items)]
    csegs, which = [], []
    for i, (it, (_, c_pos, c_mask), cache) in enumerate(zip(items, prep, caches)):
        B, T = it.completion_ids.shape
        if T == 1:
            continue
        n, P = T - 1, it.prompt_ids.shape[1]
        allowed = torch.cat([it.prompt_mask.bool()[it.seg][:, None, :].expand(B, n, P),
                             torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None] & c_mask.bool()[:, None, :]],
                            dim=2)

        def attend(li: int, k: torch.Tensor, v: torch.Tensor, cache=cache, seg=it.seg) -> tuple[torch.Tensor, ...]:
            kp, vp = cache[li]
            return torch.cat([kp[seg], k.transpose(1, 2)], dim=2), torch.cat([vp[seg], v.transpose(1, 2)], dim=2)

        csegs.append(Segment(it.completion_ids[:, :n], c_pos, padding_bias(allowed, dt)[:, None], attend, it.member))
        which.append(i)
    out = [f for f in firsts]
    if csegs:
        for i, x in zip(which, gdec.run(csegs)):
            out[i] = torch.cat([firsts[i], gdec.head(x)], dim=1)
    return out


def token_logprobs(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``grpo_math.completion_logprobs``'s tail: log-softmax of logits / temperature at the
    completion tokens (B, T)."""
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


__all__ = ["SHARED_ROWS", "GangDecoder", "Segment", "SharedItem", "share_base", "shared_prompt_logits", "token_logprobs"]
