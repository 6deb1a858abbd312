"""Reward models TRL runs itself: a ``PreTrainedModel`` for sequence classification passed
in ``reward_funcs``, charged from its shape.

TRL 1.16 (``GRPOTrainer._calculate_rewards``) decodes prompt + completion, tokenizes them
with the reward model's own tokenizer, right-padded to the longest row, and runs one
forward under ``torch.inference_mode``; the score head runs at every position (the HF
``*ForSequenceClassification`` models score each position, then pick the last real one).
:class:`RewardModelMeter` hooks each such module, reads the padded input shape of every
call and charges ``race.accounting.reward_model_flops`` (an ``orm`` over ``[n] * B``
tokens, head at all positions) under the run's conventions: ``reward/forward`` (backbone)
and ``reward/head`` (score head). The backbone shape comes from the model's config, the
head from its ``score`` (or ``classifier``) module's Linear layers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from race.accounting import ModelShape, RewardSystem, reward_model_flops
from race.accounting.conventions import Conventions
from race.accounting.errors import AccountingError
from race.models.timing import device_clock


def unwrap(model: Any) -> Any:
    """The model inside a distributed wrapper: TRL passes a reward model through
    ``prepare_deepspeed`` (a ``DeepSpeedEngine``, whose ``config`` is DeepSpeed's own dict)
    or accelerate (DDP, FSDP): each keeps the wrapped model in ``.module``."""
    import torch

    seen = 0
    while isinstance(getattr(model, "module", None), torch.nn.Module) and seen < 8:
        model, seen = model.module, seen + 1
    return model


def reward_model_shape(model: Any) -> ModelShape:
    """``ModelShape`` of a sequence-classification reward model (unwrapped first, see
    :func:`unwrap`): backbone from its config, scoring head from its ``score`` /
    ``classifier`` module."""
    import torch

    model = unwrap(model)
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)] if head is not None else []
    if not linears:
        raise AccountingError(f"reward model {type(model).__name__}: no score/classifier Linear head found, so its "
                              "FLOPs cannot be derived from its shape; wrap it in a reward function and report its "
                              "FLOPs with RaceFlopCallback.charge()")
    cfg = model.config.to_dict()
    cfg["architectures"] = []
    name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    try:
        base = ModelShape.from_hf_config(cfg, name=name)
    except (AccountingError, KeyError, ValueError) as e:
        raise AccountingError(f"reward model {name}: cannot read its shape from the config ({e}); wrap it in a "
                              "reward function and report its FLOPs with RaceFlopCallback.charge()") from None
    return replace(base, head=tuple((m.in_features, m.out_features) for m in linears),
                   head_bias=any(m.bias is not None for m in linears), tie_embeddings=False)


class RewardModelMeter:
    """Forward hooks on the reward models in ``reward_funcs``; ``drain()`` returns the
    ``reward/*`` FLOPs, tokens and seconds since the last drain."""

    def __init__(self, conventions: Conventions, clock: Any = device_clock) -> None:
        self.conventions = conventions
        self.clock = clock  # device -> seconds (synchronizing or not, see FlopTracker.sync)
        self.systems: list[RewardSystem] = []
        self._handles: list[Any] = []
        self._open: list[tuple[float, Any]] = []
        self._longest: dict[int, int] = {}  # per reward model: the longest padded row it scored
        self._comps: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._seconds: dict[str, float] = {}

    def attach(self, reward_funcs: Any) -> None:
        """Hook every ``torch.nn.Module`` in ``reward_funcs`` (replacing earlier hooks)."""
        import torch

        self.detach()
        self.systems = []
        for f in reward_funcs or []:
            if not isinstance(f, torch.nn.Module):
                continue
            i = len(self.systems)
            inner = unwrap(f)  # the model TRL's call reaches through the wrapper's forward
            self.systems.append(RewardSystem("orm", reward_model_shape(inner), type(inner).__name__))
            self._handles.append(inner.register_forward_pre_hook(
                lambda mod, args, kwargs, i=i: self._pre(i, mod, args, kwargs), with_kwargs=True))
            self._handles.append(inner.register_forward_hook(lambda mod, args, out: self._post(), always_call=True))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, i: int, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise AccountingError("a reward model call without input_ids: cannot charge it")
        B, n = int(ids.shape[0]), int(ids.shape[1])
        comps = reward_model_flops(self.systems[i], [n] * B, head_positions="all", conventions=self.conventions)
        for k, v in comps.items():
            self._comps[k] = self._comps.get(k, 0) + int(v)
        self._tokens["reward/forward"] = self._tokens.get("reward/forward", 0) + B * n
        self._longest[i] = max(self._longest.get(i, 0), n)
        device = ids.device  # read at the call: the model may have moved since attach
        self._open.append((self.clock(device), device))

    def _post(self) -> None:
        if self._open:
            t0, device = self._open.pop()
            self._seconds["reward/forward"] = self._seconds.get("reward/forward", 0.0) + self.clock(device) - t0

    def drain(self) -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
        out = (self._comps, self._tokens, self._seconds)
        self._comps, self._tokens, self._seconds = {}, {}, {}
        return out

    def bound(self, rows: int, seq_len: int) -> int:
        """Upper bound of one generation's reward-model FLOPs: ``rows`` rows at the longer of
        ``seq_len`` (prompt + completion in policy tokens) and the longest row each model has
        scored so far (its own tokenizer may split the text into more tokens: a step that
        still overruns is caught by the budget's overrun rule)."""
        total = 0
        for i, system in enumerate(self.systems):
            n = max(seq_len, self._longest.get(i, 0))
            total += sum(reward_model_flops(system, [n] * rows, head_positions="all",
                                            conventions=self.conventions).values())
        return total


__all__ = ["RewardModelMeter", "reward_model_shape"]
