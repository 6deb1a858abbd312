"""What gpu_check.py and its check modules share: the run's context and sizes, the
tolerance, the ``NotTested`` signal and the devices' peak FLOP/s (MFU). Standard library
only at import time (the project's peak table is imported when first asked)."""

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


# -- peak FLOP/s and MFU: the project's table when this tree has it (issue 24), else a local one --
#: dense peak FLOP/s (no sparsity), used when race.engines.trl.utilisation is absent
_PEAKS = (("H200", {"bfloat16": 989.4e12, "float16": 989.4e12, "float32": 66.9e12}),
          ("H100 PCIe", {"bfloat16": 756.5e12, "float16": 756.5e12, "float32": 51.2e12}),
          ("H100", {"bfloat16": 989.4e12, "float16": 989.4e12, "float32": 66.9e12}),
          ("A100", {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12}),
          ("L40S", {"bfloat16": 362.1e12, "float16": 362.1e12, "float32": 91.6e12}))


def _peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` (``torch.cuda.get_device_name``) at ``dtype``;
    None when unknown (e.g. any CPU)."""
    for key, table in _PEAKS:
        if key.lower() in device_name.lower():
            return table.get(dtype)
    return None


def _mfu(flops: float, seconds: float, peak: float) -> float:
    """Achieved FLOP/s over peak FLOP/s: ``flops / seconds / peak``."""
    return flops / seconds / peak


def _project() -> tuple[Any, Any]:
    """(the project's peak_flops, its mfu), or (None, the local mfu) in a tree without them."""
    try:
        from race.engines.trl.utilisation import mfu as project_mfu, peak_flops as project_peak
    except ImportError:
        return None, _mfu
    return project_peak, project_mfu


def mfu(flops: float, seconds: float, peak: float) -> float:
    """MFU ``flops / seconds / peak``: the project's formula when this tree has it."""
    return _project()[1](flops, seconds, peak)


def peak_flops(device_name: str, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s, where it came from): the project's table, else the local one."""
    project_peak = _project()[0]
    if project_peak is not None:
        try:
            got = project_peak(device_name, dtype)
        except Exception:  # a table that refuses this device/dtype: use the local one
            got = None
        if got:
            return float(got), "race.engines.trl.utilisation"
    return _peak_flops(device_name, dtype), "gpu_check_base (local table)"
