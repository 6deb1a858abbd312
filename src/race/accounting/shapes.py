"""Model shapes: the architecture numbers every FLOP formula needs.

A ``ModelShape`` describes a Llama/Qwen2-style decoder: ``num_layers`` blocks of
attention (``num_heads`` query heads, ``num_kv_heads`` key/value heads of ``head_dim``)
and a SwiGLU MLP (gate, up, down), an embedding of ``vocab`` rows and an output head
(``lm_head`` over the vocabulary, or a small scoring head for reward models).

Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .errors import AccountingError

#: Matrices of one decoder layer that LoRA can adapt, in PEFT's names.
LAYER_MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: model_type values whose config.json maps onto ``ModelShape``.
SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3")

#: config.json fields that mean an architecture these formulas do not describe.
_UNSUPPORTED_FIELDS = {
    "num_experts": "mixture-of-experts layers",
    "num_local_experts": "mixture-of-experts layers",
    "n_routed_experts": "mixture-of-experts layers",
    "moe_intermediate_size": "mixture-of-experts layers",
    "kv_lora_rank": "multi-head latent attention",
    "q_lora_rank": "multi-head latent attention",
}


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a decoder-only causal LM.

    ``head`` lists the output head's matrices as ``(in, out)`` pairs; ``None`` means the
    usual ``lm_head`` (hidden -> vocab). A reward model's scoring head is, e.g.,
    ``((hidden, hidden), (hidden, 2))`` for Qwen2.5-Math-PRM.
    """

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = True
    o_bias: bool = False
    mlp_bias: bool = False
    head: tuple[tuple[int, int], ...] | None = None
    head_bias: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise AccountingError(f"ModelShape.{f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise AccountingError(
                f"ModelShape: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    # -- dimensions -----------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the query projection output: heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each key/value projection output: kv heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    def matrix_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each matrix of one decoder layer, keyed by PEFT module name."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def head_matrices(self) -> tuple[tuple[int, int], ...]:
        """(in, out) of the output head's matrices (lm_head by default)."""
        return self.head if self.head is not None else ((self.hidden, self.vocab),)

    @property
    def is_lm(self) -> bool:
        return self.head is None

    # -- parameter counts -----------------------------------------------------------
    def layer_params(self) -> int:
        """Parameters of one decoder layer: 7 matrices, their biases, two RMSNorm weights."""
        dims = self.matrix_dims()
        n = sum(i * o for i, o in dims.values())
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            n += self.hidden
        if self.mlp_bias:
            n += 2 * self.intermediate + self.hidden
        return n + 2 * self.hidden

    def non_embedding_params(self) -> int:
        """Decoder layers plus the final norm (no embedding, no output head)."""
        return self.num_layers * self.layer_params() + self.hidden

    def head_params(self) -> int:
        """Output-head parameters; a tied lm_head shares the embedding and adds 0."""
        if self.head is None:
            return 0 if self.tie_embeddings else self.vocab * self.hidden
        return sum(i * o + (o if self.head_bias else 0) for i, o in self.head)

    def num_params(self) -> int:
        """All parameters; tied embeddings are counted once."""
        return self.vocab * self.hidden + self.non_embedding_params() + self.head_params()

    # -- constructors ---------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str) -> "ModelShape":
        """A named preset: the Qwen2.5 family (``-instruct`` names resolve to the base
        shapes) and ``qwen2.5-math-prm-7b`` (7B backbone, scoring head h->h->2)."""
        return preset_shape(name)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None) -> "ModelShape":
        """Read a Llama/Qwen2-style ``config.json`` (a dict, a file, or a model directory).

        Raises ``AccountingError`` naming any field that describes an architecture these
        formulas do not cover (mixture of experts, active sliding-window attention, ...).
        """
        if not isinstance(config, Mapping):
            p = Path(config)
            if p.is_dir():
                p = p / "config.json"
            if not p.exists():
                raise AccountingError(f"no config.json at {p}: pass a preset name, a config.json path or a model directory")
            with p.open() as f:
                config = json.load(f)
            name = name or p.parent.name
        return _shape_from_config(dict(config), name or str(config.get("_name_or_path") or "custom"))

    def with_layers(self, num_layers: int) -> "ModelShape":
        """The same shape with another layer count (for reduced-depth measurement)."""
        return replace(self, num_layers=num_layers)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in (
            "name", "num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate",
            "vocab", "tie_embeddings", "qkv_bias", "o_bias", "mlp_bias", "head_bias")}
        d["head"] = [list(x) for x in self.head] if self.head is not None else None
        return d


def _shape_from_config(cfg: dict[str, Any], name: str) -> ModelShape:
    mtype = cfg.get("model_type")
    if mtype is not None and mtype not in SUPPORTED_MODEL_TYPES:
        raise AccountingError(
            f"config model_type {mtype!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)} "
            "(Llama/Qwen2-style decoders with a SwiGLU MLP)"
        )
    bad = [f"{k} ({why})" for k, why in _UNSUPPORTED_FIELDS.items() if cfg.get(k)]
    if cfg.get("use_sliding_window") or (mtype == "mistral" and cfg.get("sliding_window")):
        bad.append("use_sliding_window/sliding_window (sliding-window attention)")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        bad.append(f"hidden_act={act!r} (only SwiGLU/SiLU MLPs)")
    if bad:
        raise AccountingError(f"config {name!r} has unsupported fields: {'; '.join(bad)}")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
               if k not in cfg]
    if missing:
        raise AccountingError(f"config {name!r} lacks required fields: {', '.join(missing)}")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = cfg.get("head_dim") or hidden // heads
    if mtype == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    labels = cfg.get("num_labels")
    head = None
    archs = cfg.get("architectures") or []
    if any("SequenceClassification" in a for a in archs):
        head = ((hidden, int(labels or len(cfg.get("id2label") or {}) or 1)),)
    return ModelShape(
        name=name,
        num_layers=int(cfg["num_hidden_layers"]),
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        head=head,
    )


def _load_reference() -> dict[str, Any]:
    text = resources.files("race.accounting").joinpath("data/qwen2.5-shapes.json").read_text()
    return json.loads(text)


def published_sizes() -> dict[str, float]:
    """Published total sizes (billions of parameters) of the Qwen2.5 presets."""
    return dict(_load_reference()["published_total_params_billion"])


def preset_names() -> list[str]:
    """Every preset name ``from_preset`` accepts (without the ``-instruct`` aliases)."""
    return list(_load_reference()["shapes"]) + ["qwen2.5-math-prm-7b"]


def preset_shape(name: str) -> ModelShape:
    key = name.strip().lower()
    if key.endswith("-instruct"):
        key = key[: -len("-instruct")]
    shapes = _load_reference()["shapes"]
    if key == "qwen2.5-math-prm-7b":
        base = _shape_from_config(dict(shapes["qwen2.5-7b"], model_type="qwen2"), "qwen2.5-math-prm-7b")
        h = base.hidden
        return replace(base, head=((h, h), (h, 2)), head_bias=True, tie_embeddings=False)
    if key not in shapes:
        raise AccountingError(f"unknown model preset {name!r}; known presets: {', '.join(preset_names())} "
                              "(the -instruct names work too), or pass a config.json path / model directory")
    cfg = dict(shapes[key])
    cfg.pop("attention_bias_qkv", None)
    return _shape_from_config(cfg, key)
