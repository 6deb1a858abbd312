"""Tiny random Qwen2 models of several shapes, and padded batches, for measured-vs-analytic
tests. Every model uses an attention implementation the counter measures exactly."""

from __future__ import annotations

import copy
import importlib.util

import pytest

from race.accounting import ModelShape

# race.measure needs the train extras (torch, transformers, peft); without them skip this folder.
if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")):
    collect_ignore_glob = ["test_*.py"]
    torch = build_model = None
else:
    import torch

    from race.measure import build_model

# GQA and MHA (and MQA), tied and untied heads, 1 and 3 layers, head_dim != hidden/heads.
TINY = {
    "gqa-untied-1L": ModelShape("gqa-untied-1L", num_layers=1, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                                intermediate=96, vocab=101),
    "mha-tied-3L": ModelShape("mha-tied-3L", num_layers=3, hidden=48, num_heads=4, num_kv_heads=4, head_dim=12,
                              intermediate=80, vocab=67, tie_embeddings=True),
    "gqa-wide-heads-3L": ModelShape("gqa-wide-heads-3L", num_layers=3, hidden=40, num_heads=6, num_kv_heads=2,
                                    head_dim=8, intermediate=72, vocab=53),
    "mqa-tied-1L": ModelShape("mqa-tied-1L", num_layers=1, hidden=32, num_heads=4, num_kv_heads=1, head_dim=8,
                              intermediate=64, vocab=41, tie_embeddings=True),
}


@pytest.fixture(autouse=True)
def _quiet(quiet_warnings):
    yield


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(1)  # tiny models: threads only add overhead on a shared 2-core box


@pytest.fixture(params=sorted(TINY), scope="module")
def shape(request) -> ModelShape:
    return TINY[request.param]


def padded_batch(vocab: int, rows: int = 3, width: int = 13, pads: tuple[int, ...] = (4, 2, 0), seed: int = 0):
    """Left-padded ids and mask: row i has ``pads[i]`` pad positions (the engine still runs
    the full width, so the analytic lengths are ``[width] * rows``)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    for i, p in enumerate(pads[:rows]):
        mask[i, :p] = 0
        ids[i, :p] = 0
    return ids, mask


def cpu_model(shape: ModelShape, attn: str = "eager", seed: int = 0):
    return build_model(shape, device="cpu", attn_implementation=attn, seed=seed)


def lora_model(base, rank: int, targets, *, gradient_checkpointing: str | None = None):
    """A PEFT LoRA model around a copy of ``base``. ``gradient_checkpointing``:
    None, "non-reentrant" (HF's default) or "reentrant"."""
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(base)
    if gradient_checkpointing is not None:
        base.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": gradient_checkpointing == "reentrant"})
    pm = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(targets)))
    pm.train()
    return pm


# Helpers as fixtures (test modules do not import conftest by name).
@pytest.fixture(scope="session")
def make_batch():
    return padded_batch


@pytest.fixture(scope="session")
def make_model():
    return cpu_model


@pytest.fixture(scope="session")
def make_lora():
    return lora_model
