"""Reward models from local Hugging Face directories, and the generative judge.

``orm:/path`` -- any ``*ForSequenceClassification`` checkpoint (Llama/Qwen2-style
backbone, which is what ``ModelShape`` describes): the score head runs at the last token
only (the backbone's hidden states are gathered first). One label: ``sigmoid(logit)``;
two: ``softmax[..., 1]``. With a chat template the input is ``[user: question,
assistant: completion]`` rendered by it; without one, ``prompt + completion``.

``prm:/path`` -- a process RM in the Qwen2.5-Math-PRM style: the completion is split
into steps at ``step_delimiter`` (default a blank line), a separator token (default
``<extra_0>``) is written after each step, and the 2-class head's ``softmax[..., 1]`` is
read at every separator, in one forward. Two layouts load WITHOUT ``trust_remote_code``:
``*ForTokenClassification`` (head ``Linear(hidden, n)``) and Qwen2.5-Math-PRM's own
``Qwen2ForProcessRewardModel`` weights (head ``Linear(h, h) -> ReLU -> Linear(h, 2)``,
rebuilt here from its safetensors). An optional ``race_rm.json`` in the directory sets
``markers`` (tokens already in the text to read, instead of inserting separators; RACE's
own PRMs use ``[";", "."]``), ``final_marker``, ``sep_token``, ``step_delimiter``,
``system`` (the PRM's system prompt), ``chat_template`` (true/false) and ``max_length``.

FLOPs: the backbone from the checkpoint's own ``config.json`` (``ModelShape.from_hf_config``)
and the head from the loaded score module's matrices; weights load from safetensors only.

``judge:NAME`` -- a causal LM (a tiny family name or a local directory) reads
``JUDGE_TEMPLATE`` and greedily generates ``verdict_tokens`` tokens (exactly that many:
EOS is held off, so every row decodes the same count); the reward is 1 when the verdict
starts with ``Y``/``y``. FLOPs are KV-cache prefill + decode with the judge's shape
(``reward_model_flops(kind="judge", judge_completion_lens=...)``). A judge trained for
this task is future work: the tiny policies were never taught to answer Y/N, so treat a
tiny judge as a cost and plumbing check, not as feedback quality. Loading one warns so
(:class:`JudgeRewardWarning`), once per run.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from race.accounting import ModelShape, RewardSystem, reward_model_flops
from race.accounting.reward_kinds import reward_kind
from race.models.loading import load_policy, load_tokenizer, resolve_device, resolve_dtype
from race.models.tokenizer import check_vocab_fits
from race.rewards.base import RewardOutput
from race.rewards.rm_encoding import Scorer
from race.rewards.rule_terms import rule_terms
from race.rewards.terms import weighted
from race.rewards.text import prompt_of, question_of, sanitize

#: The architectures a classifier RM may have, by its kind's classifier (``RewardKind.classifier``).
SUPPORTED = {"sequence": ("ForSequenceClassification",),
             "token": ("ForTokenClassification", "Qwen2ForProcessRewardModel")}
QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
JUDGE_TEMPLATE = "{prompt}{completion}\nCorrect? (Y/N):"


def article(kind: str) -> str:
    """``an ORM``, ``a PRM``, ``a judge``."""
    return {"orm": "an ORM", "prm": "a PRM"}.get(kind, f"a {kind}")


def _check_dir(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise FileNotFoundError(f"reward model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json (expected a directory written by save_pretrained)")
    if not ((path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()):
        raise FileNotFoundError(f"{path} has no model.safetensors (only safetensors weights are loaded)")
    return json.loads((path / "config.json").read_text())


def _settings(path: Path) -> dict[str, Any]:
    f = path / "race_rm.json"
    if not f.is_file():
        return {}
    data = json.loads(f.read_text())
    known = {"kind", "markers", "final_marker", "sep_token", "step_delimiter", "system", "chat_template", "max_length"}
    bad = set(data) - known
    if bad:
        raise ValueError(f"{f}: unknown settings {sorted(bad)}; known: {sorted(known)}")
    return data


def load_rm_tokenizer(path: Path) -> Any:
    """The directory's tokenizer, left-padded with a pad token. A plain ``tokenizers``
    tokenizer (``tokenizer_class`` TokenizersBackend / PreTrainedTokenizerFast, as the
    character tokenizer saves) is loaded as exactly that: ``AutoTokenizer`` would pick the
    config's model-type class (Qwen2Tokenizer for a Qwen2 config), whose byte-level
    pre-tokenizer silently drops spaces, newlines and unknown characters."""
    return load_tokenizer(str(path))


def head_matrices(score: Any) -> tuple[tuple[tuple[int, int], ...], bool]:
    """(in, out) of each Linear in the head, in order, and whether any has a bias."""
    import torch

    mods = [m for m in score.modules() if isinstance(m, torch.nn.Linear)]
    if not mods:
        raise ValueError(f"score head {type(score).__name__} has no Linear layer")
    return tuple((m.in_features, m.out_features) for m in mods), any(m.bias is not None for m in mods)


def scorer_shape(model: Any, name: str) -> Any:
    """``ModelShape`` of a scoring model: backbone from its config, head from its module."""
    from dataclasses import replace

    cfg = model.config.to_dict()
    cfg["architectures"] = []
    base = ModelShape.from_hf_config(cfg, name=name)
    head, bias = head_matrices(model.score)
    return replace(base, head=head, head_bias=bias, tie_embeddings=False)


class _ProcessRewardModel:
    """Qwen2.5-Math-PRM's ``Qwen2ForProcessRewardModel`` rebuilt without its remote code:
    a ``Qwen2Model`` (weights under ``model.``) and ``score`` = Linear(h, h) -> ReLU ->
    Linear(h, 2). Built on the meta device and filled from the safetensors (no random
    init of a 7B model)."""

    @staticmethod
    def load(path: Path, config: dict[str, Any], dtype: Any, device: Any) -> Any:
        import torch
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel

        cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("auto_map", "architectures")})
        cfg._attn_implementation = "eager"
        files = ([path / "model.safetensors"] if (path / "model.safetensors").is_file() else
                 sorted({path / f for f in json.loads((path / "model.safetensors.index.json").read_text())
                         ["weight_map"].values()}))
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(f), device=str(device)))
        h = cfg.hidden_size

        class PRM(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.config = cfg
                self.model = AutoModel.from_config(cfg)
                self.score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))

            @property
            def base_model(self) -> Any:
                return self.model

        with torch.device("meta"):
            m = PRM()
        missing, unexpected = m.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(f"{path}: weights do not match Qwen2ForProcessRewardModel "
                             f"(missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]})")
        with torch.device(device):  # non-persistent buffers (RoPE frequencies) are computed, not loaded
            m.model.rotary_emb = type(m.model.rotary_emb)(config=cfg)
        return m.to(dtype=dtype, device=device).eval()


def _load_model(path: Path, kind: str, config: dict[str, Any], device: Any) -> Any:
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    dtype = resolve_dtype("auto", device)  # float32 on CPU, bfloat16 on CUDA
    archs = config.get("architectures") or []
    classifier = reward_kind(kind).classifier
    if classifier == "token" and "Qwen2ForProcessRewardModel" in archs:
        return _ProcessRewardModel.load(path, config, dtype, device)
    if classifier is None:
        raise ValueError(f"{kind} is no classifier reward kind: a local directory serves orm: or prm:")
    want = SUPPORTED[classifier][0]
    if not any(a.endswith(want) for a in archs):
        raise ValueError(f"{path}: architectures {archs} cannot serve as {article(kind)}; {article(kind)} "
                         f"needs one of {', '.join('*' + s if s.startswith('For') else s for s in SUPPORTED[classifier])}")
    cls = AutoModelForSequenceClassification if classifier == "sequence" else AutoModelForTokenClassification
    model = cls.from_pretrained(path, use_safetensors=True, trust_remote_code=False, dtype=dtype,
                                attn_implementation="eager")
    return model.to(device).eval()


def rm_renderer(kind: str, tok: Any, settings: dict[str, Any]) -> tuple[Any, frozenset[int] | None, int | None]:
    """(render, marker ids, final marker id) for this RM."""
    def tok_id(t: str) -> int:
        i = tok.convert_tokens_to_ids(t)
        if i is None or i == tok.unk_token_id:
            raise ValueError(f"the RM's tokenizer has no single token {t!r}; set sep_token/markers in race_rm.json")
        return int(i)

    use_chat = bool(settings.get("chat_template", getattr(tok, "chat_template", None) is not None))

    def chat(question: str, answer: str, system: str | None) -> tuple[str, str]:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
        prefix = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": answer}], tokenize=False)
        return (prefix, full[len(prefix):]) if full.startswith(prefix) else (prefix, answer)

    final = settings.get("final_marker")
    final_id = tok_id(final) if final else None
    if not reward_kind(kind).per_step:  # one score at the last token
        if use_chat:
            return (lambda p, c: chat(question_of(p), c, settings.get("system"))), None, None
        return (lambda p, c: (prompt_of(p), c)), None, None
    if settings.get("markers"):  # markers already in the text (RACE's own PRMs)
        ids = frozenset(tok_id(m) for m in settings["markers"])
        return (lambda p, c: (prompt_of(p), c)), ids, final_id
    sep = settings.get("sep_token", "<extra_0>")
    sep_id = tok_id(sep)
    delim = settings.get("step_delimiter", "\n\n")
    system = settings.get("system", QWEN_PRM_SYSTEM)

    def render(p: Any, c: str) -> tuple[str, str]:
        steps = [s.strip() for s in c.replace(sep, "").split(delim) if s.strip()]
        body = "".join(s + sep for s in steps)
        return chat(question_of(p), body, system) if use_chat else (prompt_of(p), body)

    return render, frozenset({sep_id}), final_id


def load_hf_scorer(path: str | Path, kind: str, *, device: Any = "auto", name: str | None = None) -> Any:
    """A ``Scorer`` (see ``race.rewards.rm_encoding``) for the checkpoint at ``path``."""
    p = Path(path).expanduser()
    config = _check_dir(p)
    settings = _settings(p)
    if settings.get("kind", kind) != kind:
        raise ValueError(f"{p} is {article(settings['kind'])} (race_rm.json), not {article(kind)}: "
                         f"use {settings['kind']}:{path}")
    tok = load_rm_tokenizer(p)
    check_vocab_fits(tok, int(config.get("vocab_size", len(tok))), where=str(p))
    model = _load_model(p, kind, config, resolve_device(device))
    render, markers, final_id = rm_renderer(kind, tok, settings)
    max_len = int(settings.get("max_length") or min(int(getattr(model.config, "max_position_embeddings", 4096)), 4096))
    return Scorer(model=model, tokenizer=tok, shape=scorer_shape(model, name or p.name), render=render,
                  markers=markers, max_length=max_len, final_marker=final_id,
                  inserts_markers=reward_kind(kind).per_step and not settings.get("markers"))


# -- generative judge ------------------------------------------------------------------------
class JudgeRewardWarning(UserWarning):
    """A run uses the generative judge: its FLOPs are real, its verdicts are not feedback."""


JUDGE_NOTE = ("reward 'judge:{name}': the generative judge is a cost-and-plumbing check, not feedback: no judge "
              "was trained to answer Y/N for this task, so its verdicts carry no reliable signal about "
              "correctness. Its FLOPs are charged exactly; compare feedback quality with prm:/orm: rewards or "
              "rule rewards")


class JudgeReward:
    """A causal LM that reads the problem and completion and generates a verdict."""

    kind = "judge"

    def __init__(self, name: str, model: Any, tokenizer: Any, spec: Any, *, conventions: Any = None,
                 verdict_tokens: int = 2, max_length: int = 512, template: str = JUDGE_TEMPLATE) -> None:
        self.name, self.model, self.tok, self.spec = name, model, tokenizer, spec
        self.conventions, self.verdict_tokens, self.max_length, self.template = (conventions, verdict_tokens,
                                                                                   max_length, template)
        cfg = model.config.to_dict()
        self.shape = ModelShape.from_hf_config(cfg, name=name)
        self.system = RewardSystem("judge", self.shape, name)
        self.overhead = len(tokenizer(template.format(prompt="", completion=""), add_special_tokens=False)["input_ids"])

    @classmethod
    def load(cls, spec: Any, *, device: Any = "auto", conventions: Any = None, cache_dir: Any = None) -> "JudgeReward":
        warnings.warn(JUDGE_NOTE.format(name=spec.target), JudgeRewardWarning, stacklevel=2)
        model, tok = load_policy(spec.target, device=device, dtype="float32", attn_implementation="eager",
                                 cache_dir=cache_dir)
        return cls(Path(spec.target).name, model, tok, spec, conventions=conventions,
                   max_length=min(512, int(getattr(model.config, "max_position_embeddings", 512))))

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        import torch

        t0 = time.perf_counter()
        if not completions:
            return RewardOutput([], [])
        texts = [self.template.format(prompt=prompt_of(p), completion=sanitize(c))
                 for p, c in zip(problems, completions, strict=True)]
        self.tok.truncation_side = "left"
        enc = self.tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length,
                       add_special_tokens=False)
        device = next(self.model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        k = self.verdict_tokens
        with torch.no_grad():
            gen = self.model.generate(**enc, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                                      pad_token_id=self.tok.pad_token_id, eos_token_id=self.tok.eos_token_id)
        B, L = enc["input_ids"].shape
        verdicts = self.tok.batch_decode(gen[:, L:], skip_special_tokens=True)
        comps = reward_model_flops(self.system, [L] * B, judge_completion_lens=[k] * B, conventions=self.conventions)
        needed = [t for t in self.spec.weights if t != "rm"]
        rewards, verified, yes = [], [], 0
        for p, c, v in zip(problems, completions, verdicts):
            terms = rule_terms(p, sanitize(c), needed)
            terms["rm"] = 1.0 if v.strip()[:1] in ("Y", "y") else 0.0
            yes += int(terms["rm"])
            rewards.append(weighted(self.spec.weights, terms))
            verified.append(terms["outcome"])
        return RewardOutput(rewards, verified, components=comps, tokens=B * (L + k), seconds=time.perf_counter() - t0,
                            extra={"judge_yes_frac": yes / B})

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        """The judge reads at most ``max_length`` tokens (its input is cut there, template
        included) and writes ``verdict_tokens``: a bound whatever the prompts."""
        L = max(1, self.max_length)
        return sum(reward_model_flops(self.system, [L] * n_sequences,
                                      judge_completion_lens=[self.verdict_tokens] * n_sequences,
                                      conventions=self.conventions).values())
