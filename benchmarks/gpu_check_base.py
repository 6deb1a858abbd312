"""What gpu_check.py and its check modules share: the run's context and sizes, the
tolerance, and the ``NotTested`` signal. Standard library only at import time."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOLERANCE = 1e-3  # ledger vs measured, relative


class NotTested(Exception):
    """Raised by a check that cannot run here; the message says why."""


@dataclass
class Sizes:
    """The shapes a run uses: ``full`` on a GPU, ``reduced`` on a CPU (same code path)."""

    model: str
    batch: int  # per_device_train_batch_size
    group: int  # num_generations
    completion: int  # max_completion_length
    steps: int  # optimizer steps of a measured run
    warm_steps: int  # overhead run: steps not timed
    timed_steps: int  # overhead run: steps timed
    layers: int | None = None  # decoder layers of the policy (None: the shape's own)
    rm_layers: int = 4  # decoder layers of the reward model

    @classmethod
    def of(cls, reduced: bool) -> "Sizes":
        if reduced:
            return cls("tiny-xs", batch=8, group=4, completion=5, steps=2, warm_steps=1, timed_steps=3, layers=2,
                       rm_layers=1)
        return cls("qwen2.5-0.5b", batch=16, group=4, completion=48, steps=2, warm_steps=2, timed_steps=5)


@dataclass
class Ctx:
    """What every check reads: the device, dtype, sizes, a work directory and results that
    later checks reuse (``shared``)."""

    reduced: bool
    device: str
    dtype: str
    sizes: Sizes
    work: Path
    args: argparse.Namespace
    shared: dict[str, Any] = field(default_factory=dict)
    _model_dir: Path | None = None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def model_dir(self) -> Path:
        """A random policy of ``sizes.model``'s shape and the character tokenizer, saved once
        (safetensors) so every trainer (and TRL's reference model) loads the same weights."""
        if self._model_dir is None:
            import torch

            from race.measure import build_model
            from race.models.tokenizer import build_char_tokenizer

            tok = build_char_tokenizer()
            path = self.work / "policy"

            ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
            model = build_model(self.shape(), num_layers=self.sizes.layers, device=self.device, seed=0,
                                dtype=getattr(torch, self.dtype), **ids)
            model.save_pretrained(path, safe_serialization=True)
            tok.save_pretrained(path)
            del model
            self._model_dir = path
        return self._model_dir

    def shape(self) -> Any:
        """The policy's ``ModelShape``: a ``race.accounting`` preset (full) or a tiny-family
        shape (reduced)."""
        from race.models.refs import resolve_shape

        return resolve_shape(self.sizes.model)

    def load_policy(self, device: str | None = None) -> tuple[Any, Any]:
        from race.models import load_policy

        return load_policy(str(self.model_dir()), device=device or self.device, dtype=self.dtype,
                           attn_implementation="eager")


