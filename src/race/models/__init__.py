"""Models: the character tokenizer, the tiny Qwen2 family, model references -> shapes
(``refs``, torch-free), loading any HF causal LM, LoRA wrapping, and where the warm
starts live (``base_recipes``: recipe, hash, directory). Loading never builds: the warm
starts are trained by ``race.builds.warmstart``.

Importing this package is cheap (no torch/transformers at import time); the heavy
libraries load inside the functions that need them.
"""

from race.models.family import (
    TINY_FAMILY,
    build_tiny_model,
    count_params,
    family_table,
    is_tiny_name,
    lm_head_params,
    non_embedding_params,
    tiny_config,
    tiny_config_kwargs,
    tiny_shape,
)
from race.models.loading import (
    cache_dir,
    load_policy,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    save_policy,
)
from race.models.lora import reference_policy, trainable_params, validate_lora, wrap_lora
from race.models.refs import model_shape, resolve_shape
from race.models.timing import device_clock, is_cuda
from race.models.tokenizer import VOCAB_SIZE, build_char_tokenizer, check_vocab_fits
from race.models.base_recipes import DEFAULT_RECIPE, BaseInfo, SFTRecipe, base_dir, base_path, cached_base

__all__ = [
    "TINY_FAMILY", "VOCAB_SIZE", "DEFAULT_RECIPE", "BaseInfo", "SFTRecipe",
    "base_dir", "base_path", "build_char_tokenizer", "build_tiny_model", "cache_dir", "cached_base",
    "check_vocab_fits", "count_params", "device_clock", "family_table", "is_cuda", "is_tiny_name",
    "lm_head_params", "load_policy", "load_tokenizer", "model_shape", "resolve_shape", "non_embedding_params",
    "reference_policy", "resolve_device", "resolve_dtype", "save_policy", "tiny_config", "tiny_config_kwargs", "tiny_shape",
    "trainable_params", "validate_lora", "wrap_lora",
]
