"""Hooks that see what TRL's ``GRPOTrainer`` executes: :class:`FlopTracker` records every
call of the policy (and of TRL's separate reference model) as a
:class:`race.accounting.trl_step.ModelCall`; the phase rules are in ``trl_flops``'s
docstring. Also reads a model's shape and LoRA adapter for the formulas.

The hooks are a forward pre-hook and a forward hook on the causal LM (under PEFT, the
base model: PEFT's wrappers call it through ``__call__``, and TRL's fused forward runs
there), a pre-hook on the first decoder layer (does its input require grad?) and a thin
wrapper around the causal LM's ``generate`` (which calls belong to a rollout). They are
removed by ``detach()``.

Devices: a hook reads the model's device at its FIRST call, not at attach: under ZeRO-1/2
and FSDP the trainer keeps the model on the CPU until ``accelerate.prepare`` moves it, and a
device read at attach would never synchronize the GPU (per-phase seconds would be
kernel-launch times).

Synchronizing: with ``sync=True`` (default) every hooked call reads the clock after
``torch.cuda.synchronize`` (exact per-phase seconds; two synchronizes per call, each decode
step included). ``sync=False`` times only whole generations (synchronized) and leaves the
per-call seconds at 0 (the caller books the rest of the step as a whole).

``torch.compile``: the two hooks at the causal LM's entry and exit run under
``torch.compiler.disable``, so dynamo never traces the ledger's Python there (its clock, a
synchronize, its counters): the graph breaks at the LM's boundary, where it broke anyway at
the clock, and the LM's body stays one graph (the layer-0 hook only reads
``requires_grad`` and is traced). The compact head's kept-token count stays a device tensor
until ``drain()`` (no ``int(tensor)`` per call).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Iterator, Sequence

from race.accounting import LoRA, ModelShape
from race.accounting.errors import AccountingError
from race.accounting.trl_step import ModelCall
from race.engines.trl.internals import FUSED_HEAD_KWARG
from race.engines.trl.internals import compact_head as _compact_head
from race.models.timing import device_clock


def _eager(fn: Any) -> Any:
    """``fn`` outside any ``torch.compile`` graph (see module docstring)."""
    import torch

    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


def _checkpoint_wrapper_impl(module: Any) -> str | None:
    """``"early_stop"`` / ``"full"`` when decoder layer ``module`` is (or wraps) torch's
    ``CheckpointWrapper`` (what accelerate's FSDP ``activation_checkpointing`` wraps each
    decoder layer in: non-reentrant), else None."""
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, CheckpointWrapper
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    # FSDP1 wraps first, then checkpoints the wrapped layer (FSDP(CheckpointWrapper(layer))); an
    # offload_wrapper holds a CheckpointWrapper: find the first one inside the layer
    module = next((m for m in module.modules() if isinstance(m, CheckpointWrapper)), None)
    if module is None:
        return None
    if getattr(module, "checkpoint_impl", None) == CheckpointImpl.REENTRANT:
        return "full"
    fn = getattr(module, "checkpoint_fn", None)
    kw = dict(getattr(fn, "keywords", None) or {})
    if kw.get("use_reentrant") or kw.get("early_stop") is False:
        return "full"
    import torch.utils.checkpoint as cp

    return "full" if getattr(cp, "_checkpoint_early_stop", None) is False else "early_stop"


def causal_lm(model: Any) -> Any:
    """The module ``generate`` and TRL's fused forward run on (the HF model under PEFT)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _decoder_layers(lm: Any) -> Any:
    import torch

    n = getattr(getattr(lm, "config", None), "num_hidden_layers", None)
    for name in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        mod = lm
        for part in name.split("."):
            mod = getattr(mod, part, None)
            if mod is None:
                break
        if isinstance(mod, torch.nn.ModuleList) and len(mod):
            return mod
    for mod in lm.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) and (n is None or len(mod) == n):
            return mod
    raise AccountingError(f"cannot find the decoder layers of {type(lm).__name__}")


def _lora_layers(model: Any) -> list[Any]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def lora_of(model: Any, shape: ModelShape) -> LoRA | None:
    """The LoRA adapter a PEFT model carries, as ``race.accounting.LoRA`` (None without
    one). Refuses what the formulas do not cover: DoRA, adapters outside the decoder
    layers' seven matrices, per-module ranks."""
    layers = _lora_layers(model)
    if not layers:
        return None
    targets: list[str] = []
    ranks: set[int] = set()
    from race.accounting import LAYER_MATRICES

    names = {id(m): n for n, m in model.named_modules()}
    for m in layers:
        name = names[id(m)].rsplit(".", 1)[-1]
        if name not in LAYER_MATRICES:
            raise AccountingError(f"LoRA on {names[id(m)]!r}: the accounting covers adapters on "
                                  f"{', '.join(LAYER_MATRICES)} only; remove it from target_modules")
        for ad in m.active_adapters:
            if ad in m.r:
                ranks.add(int(m.r[ad]))
            if getattr(m, "use_dora", {}).get(ad, False):
                raise AccountingError("DoRA adapters (use_dora=True) are not covered by the accounting")
        if name not in targets:
            targets.append(name)
    if len(ranks) != 1:
        raise AccountingError(f"LoRA ranks {sorted(ranks)} differ between modules; the accounting needs one rank")
    lora = LoRA(ranks.pop(), tuple(t for t in LAYER_MATRICES if t in targets))
    lora.check(shape)
    return lora


def _checkpointing(layers: Any) -> tuple[str | None, int]:
    """How the decoder layers are checkpointed right now: (None | "early_stop" | "full",
    number of checkpointed layers; ``every_n_layers`` checkpoints only some)."""
    wrapped = [_checkpoint_wrapper_impl(m) for m in layers]
    if any(wrapped):  # accelerate's FSDP activation checkpointing: CheckpointWrapper around each layer
        on_w = [w for w, m in zip(wrapped, layers) if w is not None and m.training]
        if on_w:
            return ("full" if "full" in on_w else "early_stop"), len(on_w)
    on = [m for m in layers if getattr(m, "gradient_checkpointing", False) and m.training]
    if not on:
        return None, 0
    layer = on[0]
    fn = getattr(layer, "_gradient_checkpointing_func", None)
    kw = dict(getattr(fn, "keywords", None) or {})
    reentrant = kw.get("use_reentrant")
    if reentrant is None:
        reentrant = True  # torch.utils.checkpoint's default when not passed
    if reentrant or kw.get("early_stop") is False:
        return "full", len(on)
    import torch.utils.checkpoint as cp

    early = getattr(cp, "_checkpoint_early_stop", None)
    return ("full" if early is False else "early_stop"), len(on)


class FlopTracker:
    """Records every call of the hooked models (see module docstring). ``drain()`` hands
    the calls recorded since the last drain to the caller."""

    def __init__(self, *, sync: bool = True) -> None:
        self.sync = sync  # synchronize the device around every hooked call (see module docstring)
        self.calls: list[ModelCall] = []
        self._handles: list[Any] = []
        self._patched: list[tuple[Any, Any]] = []
        self._paused = 0
        self._open: list[dict[str, Any]] = []
        self._gen_depth = 0
        self._gen_first = False
        self.generate_seconds = 0.0
        self.weight_sync_seconds = 0.0  # vLLM weight syncs (timed by the callback), kept apart from rollouts
        self.last_generation: tuple[int, int, int] | None = None  # (rows, padded prompt, generated width)
        self.generations: list[tuple[int, int, int]] = []  # every generation seen, in order
        self._gen_shape: list[int] | None = None

    # -- install ---------------------------------------------------------------------
    def attach(self, model: Any, *, role: str = "policy") -> None:
        """Hook ``model`` (a PEFT wrapper or an HF causal LM). ``role="reference"`` marks a
        separate reference model: every call of it is charged to ``reference``."""
        if role not in ("policy", "reference"):
            raise ValueError(f"role must be 'policy' or 'reference', got {role!r}")
        lm = causal_lm(model)
        layers = _decoder_layers(lm)
        loras = _lora_layers(model)
        probe = loras[0] if loras else None
        state = {"role": role, "lm": lm, "layers": layers, "probe": probe, "device": None}  # device: at first call
        self._handles.append(lm.register_forward_pre_hook(
            _eager(lambda mod, args, kwargs: self._pre(state, args, kwargs)), with_kwargs=True))
        self._handles.append(lm.register_forward_hook(_eager(lambda mod, args, out: self._post()), always_call=True))
        self._handles.append(layers[0].register_forward_pre_hook(  # traceable: no graph break inside the model
            lambda mod, args, kwargs: self._layer0(args, kwargs), with_kwargs=True))
        had = "generate" in lm.__dict__
        original = lm.__dict__.get("generate")
        bound = lm.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            self._gen_depth += 1
            self._gen_first = True
            self._gen_shape = None
            device = self.device_of(state)
            t0 = device_clock(device)
            try:
                return bound(*args, **kwargs)
            finally:
                self._gen_depth -= 1
                if not self._paused:
                    self.generate_seconds += device_clock(device) - t0
                    if self._gen_shape is not None:
                        self.last_generation = tuple(self._gen_shape)  # type: ignore[assignment]
                        self.generations.append(self.last_generation)  # type: ignore[arg-type]

        object.__setattr__(lm, "generate", generate)
        self._patched.append((lm, original if had else None))

    @staticmethod
    def device_of(state: dict[str, Any]) -> Any:
        """The hooked model's device, read at its first call (see module docstring)."""
        if state["device"] is None:
            state["device"] = next(state["lm"].parameters()).device
        return state["device"]

    def clock(self, device: Any) -> float:
        """A per-call clock reading: synchronized when ``sync`` is on."""
        return device_clock(device) if self.sync else 0.0

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for lm, original in self._patched:
            if original is None:
                lm.__dict__.pop("generate", None)
            else:
                object.__setattr__(lm, "generate", original)
        self._patched.clear()

    @property
    def is_paused(self) -> bool:
        return self._paused > 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Record nothing inside (evaluation the caller charges itself)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def drain(self) -> list[ModelCall]:
        out, self.calls = self.calls, []
        return [replace(c, head_positions=int(c.head_positions)) if not isinstance(c.head_positions, int) else c
                for c in out]

    # -- hooks -------------------------------------------------------------------------
    def _pre(self, st: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> None:
        import torch

        if self._paused:
            self._open.append({"skip": True})
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is None:
            raise AccountingError("a model call without input_ids or inputs_embeds: cannot account it")
        B, n = int(ids.shape[0]), int(ids.shape[1])
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        cached = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        fused = bool(kwargs.get(FUSED_HEAD_KWARG, False))
        lm = st["lm"]
        if fused:
            shift = kwargs.get("shift_labels")
            labels = shift if shift is not None else kwargs.get("labels")
            if _compact_head(lm):
                kept = labels if shift is not None else labels[:, 1:]
                head = (kept != -100).sum()  # a device tensor: read in drain(), not here (no sync per call)
            else:
                head = B * (n if shift is not None else n - 1)
        else:
            k = kwargs.get("logits_to_keep", 0)
            if isinstance(k, torch.Tensor):
                head = B * int(k.numel()) if k.dim() <= 1 else int(k.sum())
            else:
                k = int(k or 0)
                head = B * (n if k == 0 else min(k, n))
        grad = torch.is_grad_enabled()
        probe = st["probe"]
        lora_on = probe is not None and not probe.disable_adapters
        ref_adapter = probe is not None and "ref" in (probe.active_adapters or [])
        if self._gen_depth and not grad:
            phase, comp = "rollout", "prefill" if self._gen_first else "decode"
            if self._gen_first:
                self._gen_shape = [B, n, 0]
            if self._gen_shape is not None:
                self._gen_shape[2] += 1
            self._gen_first = False
        elif grad:
            if st["role"] == "reference":
                raise AccountingError("the reference model ran with gradients enabled; cannot account it")
            phase, comp = "update", "forward"
        elif st["role"] == "reference" or ref_adapter or (probe is not None and not lora_on):
            phase, comp = "reference", "forward"
        else:
            phase, comp = "old_logprobs", "forward"
        recompute, n_ckpt = _checkpointing(st["layers"]) if phase == "update" else (None, 0)
        call = ModelCall(phase=phase, component=comp, batch=B, new_tokens=n, cached=cached, head_positions=head,
                         lora=lora_on and st["role"] == "policy", fused_head=fused and phase == "update",
                         recompute=recompute, recompute_layers=n_ckpt)
        device = self.device_of(st)
        self._open.append({"skip": False, "t0": self.clock(device), "device": device, "irg": None, "call": call})

    def _layer0(self, args: tuple, kwargs: dict[str, Any]) -> None:
        if not self._open or self._open[-1].get("skip") or self._open[-1]["irg"] is not None:
            return
        hs = args[0] if args else kwargs.get("hidden_states")
        self._open[-1]["irg"] = bool(getattr(hs, "requires_grad", False))

    def _post(self) -> None:
        if not self._open:
            return
        st = self._open.pop()
        if st.get("skip"):
            return
        call: ModelCall = st["call"]
        call = replace(call, inputs_require_grad=bool(st["irg"]) and call.phase == "update",
                       seconds=self.clock(st["device"]) - st["t0"])
        self.calls.append(call)


def bound_prompt_length(tokenizer: Any, prompts: Sequence[Any], *, chat_template_kwargs: dict | None = None,
                        tools: Sequence[Any] | None = None, chat_template: str | None = None) -> int:
    """Longest tokenised prompt, tokenised as TRL does (``_tokenize_prompts``: the chat
    template for conversational prompts, with the trainer's ``tools`` (all of them: an
    environment's subset renders no longer) and its ``chat_template``; plain
    ``tokenizer(text=...)`` otherwise)."""
    longest = 0
    extra = {"tools": list(tools)} if tools else {}
    if chat_template is not None:
        extra["chat_template"] = chat_template
    for p in prompts:
        if isinstance(p, list):
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, **extra,
                                                **(chat_template_kwargs or {}))
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text=p)["input_ids"]
        longest = max(longest, len(ids))
    if longest < 1:
        raise AccountingError("no prompt tokens found: cannot bound a step")
    return longest


__all__ = ["FlopTracker", "bound_prompt_length", "causal_lm", "lora_of"]
