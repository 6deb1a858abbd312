"""Models: the character tokenizer, the tiny Qwen2 family, model references -> shapes
(``refs``, torch-free), loading any HF causal LM, LoRA wrapping, and the warm starts
(built with ``race.builds``).

Importing this package is cheap (no torch/transformers at import time); the heavy
libraries load inside the functions that need them.
"""

from race.models.family import (
    TINY_FAMILY,
    build_tiny_model,
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
from race.models.warmstart import (
    DEFAULT_RECIPE,
    BaseInfo,
    SFTRecipe,
    base_dir,
    build_all,
    build_base,
    evaluate_greedy,
    greedy_completions,
)

__all__ = [
    "TINY_FAMILY", "VOCAB_SIZE", "DEFAULT_RECIPE", "BaseInfo", "SFTRecipe",
    "base_dir", "build_all", "build_base", "build_char_tokenizer", "build_tiny_model", "cache_dir",
    "check_vocab_fits", "device_clock", "evaluate_greedy", "family_table", "greedy_completions", "is_cuda", "is_tiny_name",
    "lm_head_params", "load_policy", "load_tokenizer", "model_shape", "resolve_shape", "non_embedding_params",
    "reference_policy", "resolve_device", "resolve_dtype", "save_policy", "tiny_config", "tiny_config_kwargs", "tiny_shape",
    "trainable_params", "validate_lora", "wrap_lora",
]
