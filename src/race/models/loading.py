"""Load any policy through one code path: a tiny family name, a local HF directory, or a
hub name already in the local Hugging Face cache.

Rules that hold for every source:

- weights load through safetensors only (``use_safetensors=True``): no pickle;
- the tokenizer is checked against the model's embedding size BEFORE the weights load;
  a tokenizer with more ids than the model has embeddings is refused;
- ``device="auto"`` picks CUDA when available, else CPU; ``dtype="auto"`` is bfloat16 on
  CUDA and float32 on CPU (CPU bf16 matmuls are slow and the accounting tests compare
  fp32 numbers);
- tokenizers come back with LEFT padding and a pad token (the EOS token when the model
  defines none), which batched generation needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from race.artefacts.cache import cache_root as cache_dir  # race.models.cache_dir: the cache root (race.artefacts)
from race.models.base_recipes import base_path
from race.models.family import is_tiny_name
from race.models.imported import imported_path, is_imported_name
from race.models.refs import hub_download_command, looks_like_path
from race.models.tokenizer import check_vocab_fits

ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


def resolve_device(device: str | Any = "auto") -> Any:
    """``"auto"`` -> ``cuda`` when available else ``cpu``; anything else is passed to
    ``torch.device`` (a clear error when CUDA is requested but missing)."""
    import torch

    if isinstance(device, torch.device):
        return device
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here; use device='cpu' or 'auto'")
    return dev


def resolve_dtype(dtype: str | Any, device: Any) -> Any:
    """``"auto"`` -> bfloat16 on CUDA, float32 otherwise; names like ``"bf16"`` accepted."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} not understood; use auto, float32, bfloat16 or float16")
    return getattr(torch, _DTYPES[dtype])


def _has_safetensors(path: Path) -> bool:
    return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()


def _local_dir_problem(path: Path) -> str | None:
    if not path.is_dir():
        return f"{path} is not a directory"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json (expected a directory written by save_pretrained)"
    if not _has_safetensors(path):
        extra = " (found pytorch_model.bin: re-save with save_pretrained(safe_serialization=True))" \
            if (path / "pytorch_model.bin").exists() else ""
        return f"{path} has no model.safetensors{extra}"
    return None


def resolve_source(name_or_path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
                   ) -> tuple[str, dict[str, Any]]:
    """Where to load ``name_or_path`` from: ``(path_or_hub_name, from_pretrained kwargs)``.

    Tiny names resolve to their warm-start directory, imported names (``smollm2-135m``) to
    their directory (a NotBuiltError naming ``race base import`` when missing: imports
    happen only by that command) (a
    :class:`~race.artefacts.cache.NotBuiltError` naming ``race base build`` when it is not
    built: loading never builds; a run builds its warm start first, ``race.builds.demand``);
    existing paths must be complete HF directories; anything else is
    treated as a hub name, first looked up in the local HF cache only
    (``local_files_only=True``); :func:`load_policy` goes online only when that fails and
    ``HF_HUB_OFFLINE`` is not set.
    """
    name = os.fspath(name_or_path)
    if is_tiny_name(name):
        return str(base_path(name, cache_dir=cache_dir)), {}
    if is_imported_name(name):
        return str(imported_path(name, cache_dir=cache_dir)), {}
    path = Path(name).expanduser()
    if looks_like_path(name):
        problem = _local_dir_problem(path)
        if problem is not None:
            raise FileNotFoundError(f"cannot load policy from {name!r}: {problem}")
        return str(path), {}
    return name, {"local_files_only": True}


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no")


def _hub_error(name: str, err: Exception) -> FileNotFoundError:
    return FileNotFoundError(
        f"could not load {name!r}: it is not a tiny family name, not an existing local directory, and "
        f"not available from the Hugging Face cache ({type(err).__name__}: {str(err).splitlines()[0][:200]}). "
        f"Offline, download it elsewhere (e.g. `{hub_download_command(name)} --local-dir DIR`) and pass the "
        "directory.")


def load_tokenizer(source: str, **kwargs: Any) -> Any:
    """Tokenizer from a directory or hub name, with left padding and a pad token.

    A plain ``tokenizers`` tokenizer saved by RACE (``tokenizer_class`` TokenizersBackend /
    PreTrainedTokenizerFast, as the character tokenizer saves) is loaded as exactly that:
    ``AutoTokenizer`` would pick the config's model-type class (Qwen2Tokenizer for a Qwen2
    config), whose byte-level pre-tokenizer silently drops spaces, newlines and unknown
    characters."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(source)
    cfg_file = path / "tokenizer_config.json"
    cls = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    if cls in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").is_file():
        tok = PreTrainedTokenizerFast.from_pretrained(str(path), **kwargs)
    else:
        tok = AutoTokenizer.from_pretrained(source, **kwargs)
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer of {source!r} has neither a pad nor an eos token; set one before training")
        tok.pad_token = tok.eos_token
    return tok


def load_policy(name_or_path: str | os.PathLike[str], *, device: str | Any = "auto", dtype: str | Any = "auto",
                attn_implementation: str = "eager", cache_dir: str | os.PathLike[str] | None = None
                ) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for a tiny family name, a local directory or a hub name.

    Args:
        name_or_path: ``"tiny-s"`` (the cached warm start), a directory holding
            ``config.json`` + safetensors weights + tokenizer files, or a hub name such as
            ``"Qwen/Qwen2.5-0.5B"`` (only from the local HF cache when offline).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``.
        attn_implementation: ``"eager"`` (default: FLOP counters see every matmul) or
            ``"sdpa"`` (faster; torch's CPU fused kernel is invisible to FlopCounterMode).
        cache_dir: RACE cache root for tiny names (default :func:`cache_dir`). A tiny
            size that is not built raises ``NotBuiltError`` (``race.builds.demand.ensure_base``
            builds it).

    The model is returned in eval mode on the chosen device.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={attn_implementation!r}; use one of {ATTN_IMPLEMENTATIONS}")
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    source, kw = resolve_source(name_or_path, cache_dir=cache_dir)
    is_hub = "local_files_only" in kw
    try:
        try:
            config = AutoConfig.from_pretrained(source, **kw)
        except OSError:
            if not is_hub or _hub_offline():
                raise
            kw = {"local_files_only": False}  # not cached: let huggingface_hub download it
            config = AutoConfig.from_pretrained(source, **kw)
        tok = load_tokenizer(source, **kw)
    except OSError as err:
        if is_hub:
            raise _hub_error(source, err) from None
        raise
    check_vocab_fits(tok, int(config.vocab_size), where=source)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=torch_dtype, use_safetensors=True,
            attn_implementation=attn_implementation, **kw)
    except OSError as err:
        if is_hub:
            raise _hub_error(source, err) from None
        raise
    emb_rows = model.get_input_embeddings().weight.shape[0]
    check_vocab_fits(tok, int(emb_rows), where=source)
    model.to(dev)
    model.eval()
    return model, tok


def save_policy(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` to ``path`` so that
    :func:`load_policy` reads them back. PEFT-wrapped models save their adapter only."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
