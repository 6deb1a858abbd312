"""How a scoring model reads a batch: the encoding (left-padded prompt + completion, the
positions the head reads) and the one scoring forward, shared by RACE's RM training
(:mod:`race.builds.rm_training`) and every learned reward at run time
(:mod:`race.rewards.learned`); and :class:`Scorer`, what a loaded reward model carries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from race.tasks.arith import END_MARK, STEP_SEP

#: Most markers a PRM scores per sequence (a real solution has n_ops + 1 <= 65).
MAX_MARKERS = 65
MARKERS = (STEP_SEP, END_MARK)
#: Tokens a RACE-built RM reads at most (prompt + completion).
MAX_LENGTH = 256


@dataclass
class Scorer:
    """What a reward model needs to score: the model (``base_model`` + ``score`` head), its
    tokenizer, its ``ModelShape``, how texts are rendered and which token ids it reads."""

    model: Any
    tokenizer: Any
    shape: Any
    render: Any  # (problem, completion) -> (prefix text, body text)
    markers: frozenset[int] | None  # PRM: token ids read in the body; ORM: None (last token)
    max_length: int
    final_marker: int | None = None  # PRM: an unfinished trajectory (no final marker) scores 0 at the end
    inserts_markers: bool = False  # PRM: render() writes a separator after each step (one per step at most)


def marker_ids(tok: Any) -> list[int]:
    return [tok.convert_tokens_to_ids(m) for m in MARKERS]


def encode(tok: Any, prompts: Sequence[str], completions: Sequence[str], kind: str, *, max_length: int,
           markers: Sequence[int] | None = None) -> dict[str, Any]:
    """Left-padded batch of ``prompt + completion`` in the RM's tokenisation, cut to
    ``max_length`` tokens (the prompt end and the completion start are kept), and the
    positions the head reads, by ``kind``'s head rule (``race.accounting.reward_kinds``): the
    marker tokens of the completion (``markers``, a PRM's: at most :data:`MAX_MARKERS` per
    row) or the last token (``last``, an ORM's).

    Returns ``input_ids``/``attention_mask`` [B, L], ``position_ids`` [B, L] (counting
    real tokens only, so left padding does not shift positions), ``rows``/``cols`` [K]
    (the head positions), ``counts`` (head positions per row) and ``completion_start``."""
    import torch

    from race.accounting.reward_kinds import reward_kind

    per_step = reward_kind(kind).per_step
    p_ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
    c_ids = tok(list(completions), add_special_tokens=False)["input_ids"]
    seqs, starts = [], []
    for p, c in zip(p_ids, c_ids):
        p = p[-max(1, max_length // 2):] if len(p) + len(c) > max_length else p
        s = (p + c)[:max_length]
        seqs.append(s if s else [tok.pad_token_id])
        starts.append(len(p))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    counts: list[int] = []
    mset = set(markers if markers is not None else marker_ids(tok))
    for i, s in enumerate(seqs):
        off = width - len(s)
        ids[i, off:] = torch.tensor(s)
        mask[i, off:] = 1
        if per_step:
            pos = [off + j for j in range(starts[i], len(s)) if s[j] in mset][:MAX_MARKERS]
        else:
            pos = [width - 1]
        rows.extend([i] * len(pos))
        cols.extend(pos)
        counts.append(len(pos))
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                rows=torch.tensor(rows, dtype=torch.long),
                cols=torch.tensor(cols, dtype=torch.long), counts=counts, completion_start=starts)


def head_logits(model: Any, batch: dict[str, Any]) -> Any:
    """One forward of the backbone over the padded batch, then the scoring head at the
    gathered positions only: logits [K, num_labels]."""
    body = model.base_model
    hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch["position_ids"], use_cache=False).last_hidden_state  # [B, L, h]
    return model.score(hidden[batch["rows"], batch["cols"]])  # [K, C]


def positive_prob(logits: Any) -> Any:
    """p(label 1) per head position: softmax over 2 classes, sigmoid of 1 logit."""
    import torch

    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[..., 0].float())
    return torch.softmax(logits.float(), dim=-1)[..., 1]
