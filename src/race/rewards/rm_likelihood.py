"""Likelihood PRMs: a warm start reads the completion and scores each step by how likely
it finds the step's tokens; a calibrated logistic map turns that into p(step ok).

Why: the warm starts' wrong steps are arithmetic slips (``32-8=23``), and checking
``a-b=c`` is exactly what a warm start learned during SFT; a classifier head trained from
scratch on a few hundred batches does not learn it (measured: step AUC ~0.7 after 150
steps from the tiny-m warm start, 0.63 for prm-xs), while tiny-m's own log-likelihood
ranks good over bad steps of held-out policy samples at AUC ~0.93 with no training.

Scoring (:func:`likelihood_model`): ONE forward of the causal LM over the left-padded
``prompt + completion`` batch, logits at every position; ``lp[j] = log p(x_j | x_<j)``.
A STEP is the run of tokens after a boundary token (``;``, ``.`` or the prompt's final
``:``) up to and including the next one, so a marker (``;`` ending a step, ``.`` closing
``#answer``) closes exactly its step. Two features at each position: the step's summed
``lp`` so far and its smallest ``lp``; at a marker they describe the whole step. The score
head is ``Linear(2, 2)`` with class-0 row zero, so ``softmax[..., 1] = sigmoid(w . f + b)``:
the same ``head_logits``/``positive_prob`` path as a classifier PRM reads it, and
``race.rewards.learned`` uses it unchanged.

Calibration (:func:`race.builds.rm_calibration.calibrate`, a build step): ``(w, b)`` by class-balanced logistic regression
(full-batch L-BFGS, ``recipe.steps`` iterations) on the features at the markers of the
recipe's policy-sample pool, labels from ``race.tasks.verify``. Its FLOPs are the
forward passes over the pool (``forward_flops``, logits at every position; no backward
through the LM); the LM's own training is its warm start's SFT (``origin.base_sft_flops``).

FLOPs at run time: the RM's shape is the LM's (``lm_head`` as its head) and the head runs
at every position (``head_positions="all"``); the log-softmax, the gathers, the running
sums and the 2x2 calibration are elementwise (0 FLOPs by RACE's conventions).

Outcome RMs (``orm-m``) are the same with one "step", the whole completion, read at its
last token against final-answer correctness.

The artefact is a plain HF causal-LM directory (config, safetensors, tokenizer) plus
``race_rm.json`` with ``"scoring": "likelihood"`` and the calibration; only RACE loads
it as a PRM (:func:`load_likelihood_scorer`), ``prm:/path`` expects a classifier.
"""

from __future__ import annotations

from typing import Any

#: Tokens after which a new step starts (the prompt ends with ``:``); an outcome RM's one
#: "step" is the whole completion (read at its last token).
BOUNDARIES = {"prm": (";", ".", ":"), "orm": (":",)}
N_FEATURES = 2


def step_features(lm: Any, input_ids: Any, attention_mask: Any, position_ids: Any, boundary_ids: Any) -> Any:
    """[B, L, 2] features per position: (summed lp, min lp) of the step so far (module docstring)."""
    import torch

    logits = lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=False).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    lp = torch.nn.functional.pad(lp, (1, 0))  # position 0 has no prediction: 0
    is_b = torch.isin(input_ids, boundary_ids)
    B, L = input_ids.shape
    total = torch.zeros(B, dtype=lp.dtype, device=lp.device)
    low = torch.zeros(B, dtype=lp.dtype, device=lp.device)
    fresh = torch.ones(B, dtype=torch.bool, device=lp.device)
    out = []
    for j in range(L):
        total = torch.where(fresh, lp[:, j], total + lp[:, j])
        low = torch.where(fresh, lp[:, j], torch.minimum(low, lp[:, j]))
        out.append(torch.stack([total, low], dim=-1))
        fresh = is_b[:, j]
    return torch.stack(out, dim=1)


def likelihood_model(lm: Any, boundary_ids: list[int], weight: list[float], bias: float) -> Any:
    """The LM wrapped as a PRM: ``.base_model(...)`` returns the features as
    ``last_hidden_state``, ``.score`` the calibrated ``Linear(2, 2)``."""
    import torch

    class _Body(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm
            self.register_buffer("boundary_ids", torch.tensor(boundary_ids, dtype=torch.long), persistent=False)

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, use_cache: bool = False) -> Any:
            from types import SimpleNamespace

            return SimpleNamespace(last_hidden_state=step_features(self.lm, input_ids, attention_mask, position_ids,
                                                                   self.boundary_ids))

    class LikelihoodPRM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base_model = _Body()
            self.score = torch.nn.Linear(N_FEATURES, 2)
            set_calibration(self, weight, bias)

    return LikelihoodPRM().eval()


def set_calibration(model: Any, weight: list[float], bias: float) -> None:
    import torch

    with torch.no_grad():
        model.score.weight.zero_()
        model.score.bias.zero_()
        model.score.weight[1] = torch.tensor(weight, dtype=model.score.weight.dtype)
        model.score.bias[1] = float(bias)


def boundary_ids(tok: Any, kind: str = "prm") -> list[int]:
    return [tok.convert_tokens_to_ids(b) for b in BOUNDARIES[kind]]


def load_likelihood_scorer(path: Any, settings: dict[str, Any], *, device: Any = "cpu", name: str = "rm") -> Any:
    """A :class:`race.rewards.rm_encoding.Scorer` for a likelihood PRM directory."""
    from dataclasses import replace

    from race.models.loading import load_policy
    from race.models.refs import model_shape
    from race.rewards.hf import rm_renderer
    from race.rewards.rm_encoding import Scorer

    lm, tok = load_policy(str(path), device=device, dtype="float32")
    cal = settings["calibration"]
    kind = settings["kind"]
    model = likelihood_model(lm, boundary_ids(tok, kind), cal["weight"], cal["bias"]).to(next(lm.parameters()).device)
    render, markers, final_id = rm_renderer(kind, tok, settings)
    scorer = Scorer(model, tok, replace(model_shape(lm), name=name), render, markers, int(settings["max_length"]),
                    final_marker=final_id)
    scorer.head_positions = "all"  # type: ignore[attr-defined]  # the lm_head runs at every position
    return scorer
