"""A lean sampler: shared-prefix prefill, then a KV-cache decode loop.

Why not ``model.generate``: HF's generate runs logits processors, stopping criteria and
cache bookkeeping on every step; at pilot-grid scale (tiny models, CPU) that overhead is
most of a step. This loop does only what GRPO needs:

Two interchangeable forwards run it: the functional decoder of ``fast_decode`` (default
for Qwen2/Llama-style models: preallocated KV cache, no per-call overhead) and the HF model
with its ``DynamicCache`` (any architecture). Both execute the same FLOPs.

1. prefill each distinct prompt ONCE (left-padded batch, logits at the last position);
2. repeat the KV cache G times (``share_prompt``: the G samples share the prefix);
3. decode: sample (or argmax), append, one 1-token forward per step, until every row has
   produced EOS or ``max_new_tokens`` tokens exist.

Finished rows leave the batch (functional decoder): once at least an eighth of the rows
still decoding have produced EOS, those rows' KV cache is dropped and later steps run
only the others (one gather of the cache per drop; pilot rollouts and evaluations whose
completions end early stop paying for them). The HF forward keeps every row to the end.

What executes (for the ledger): a prefill of ``n_prompts x P`` (P = padded prompt
length) with the head at one position per prompt, and for each row ``d - 1`` decode
forwards, ``d`` being the tokens it produced while in the batch (``Rollout.decoded``:
its completion length, plus any padding steps before it was dropped; ``T``, the longest
row's length, for every row where rows are not dropped).
``race.accounting.generate_components(shape, [P] * n_prompts, d, share_prompt=True)`` is
exactly that; :func:`rollout_flops` gives it for a :class:`Rollout`.

LoRA merge (``merge_lora``): the functional decoder may fold the adapters into new weights
for the rollout (``W + s B A``, one ``out x r x in`` matmul per adapted matrix) and run
every token through the merged weights. By default it merges when the base weights'
dtype holds the folded delta (float32 or wider: ``fast_decode.fold_keeps_update``) and
merging executes fewer FLOPs than running the adapters over every position of a
full-length rollout (at pilot scale in float32 it always does, and a decode step runs one
matmul per projection instead of three). A bfloat16/float16 base never merges: rounded to
the base's dtype, a small update is lost (most deltas are below half a unit in the last
place of their weight), so the sampling policy would not be the trained one; the adapters
run live, in float32, as in the learning passes, and ``merge_lora=True`` is refused there.
The ledger charges what executed, never the LoRA convention for a merged rollout: the
base model's prefill and decode (no LoRA term) plus ``merge`` = ``2 r in out`` per adapted
matrix (``race.accounting.lora.lora_merge_flops``); an unmerged rollout, the passes with
their LoRA term. Merging only when it costs fewer FLOPs at full length keeps a step's
rollout charge at or below the unmerged bound the budget check uses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

import torch

from race.engines.kernels.fast_decode import FastDecoder
from race.tasks import step_seed




def sampling_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of the sampling draws a run with seed ``seed`` makes at step ``step``,
    seeded ``step_seed(seed, step, "sampling")`` (``seed * 7_919 + step``: every engine that
    samples a step uses it, so a gang member draws what the solo engine draws)."""
    return torch.Generator(device="cpu").manual_seed(step_seed(seed, step, "sampling"))


@dataclass(frozen=True)
class SampleArgs:
    """One run's sampling arguments at one step (:func:`sample`'s keywords): its group size,
    the completions' maximum length, its tokenizer's EOS and pad ids, its temperature and the
    step's generator (:func:`sampling_generator`)."""

    group: int
    max_new_tokens: int
    eos_id: int
    pad_id: int
    temperature: float
    generator: torch.Generator | None

    def kwargs(self) -> dict[str, Any]:
        """:func:`sample`'s keywords (the generator itself, not a copy)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # (B, P) left-padded, B = n_prompts * group, rows grouped by prompt
    prompt_mask: torch.Tensor  # (B, P) 1 on real prompt tokens
    completion_ids: torch.Tensor  # (B, T) right-padded with pad after EOS
    completion_mask: torch.Tensor  # (B, T) 1 up to and including EOS
    truncated: torch.Tensor  # (B,) bool: no EOS within T tokens
    n_prompts: int
    group: int
    merged: bool = False  # the rollout ran LoRA-merged weights (see module docstring)
    decoded: torch.Tensor | None = None  # (B,) tokens each row produced in the batch; None: T for every row

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])

    @property
    def completion_len(self) -> int:
        """T: tokens produced by the longest row (decode forwards executed = T - 1)."""
        return int(self.completion_ids.shape[1])

    @property
    def lengths(self) -> torch.Tensor:  # (B,) real completion lengths (EOS included)
        return self.completion_mask.sum(1)


def encode_prompts(tokenizer: Any, prompts: list[str], device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (ids, mask) for a list of prompt strings."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def _cache_kwarg(model: Any) -> str:
    """transformers >= 5.24 names the KV-cache argument ``cache`` (``past_key_values`` is
    deprecated there); older releases only know ``past_key_values``."""
    import inspect

    fwd = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    return "cache" if "cache" in inspect.signature(fwd).parameters else "past_key_values"


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def sample(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **kwargs: Any) -> Rollout:
    """Sample ``group`` completions for each prompt row: :func:`_sample` under
    ``torch.inference_mode`` (no autograd bookkeeping at all: ~15% faster than
    ``no_grad`` for the tiny models' overhead-bound decode loop), with the returned tensors
    cloned out of inference mode so training can use them."""
    with torch.inference_mode():
        ro = _sample(model, prompt_ids, prompt_mask, **kwargs)
    return Rollout(prompt_ids=ro.prompt_ids.clone(), prompt_mask=ro.prompt_mask.clone(),
                   completion_ids=ro.completion_ids.clone(), completion_mask=ro.completion_mask.clone(),
                   truncated=ro.truncated.clone(), n_prompts=ro.n_prompts, group=ro.group, merged=ro.merged,
                   decoded=None if ro.decoded is None else ro.decoded.clone())


def rollout_flops(policy: Any, ro: Rollout) -> dict[str, int]:
    """``prefill``, ``decode`` (and ``merge`` for a merged rollout) FLOPs that ``ro``
    executed on ``policy`` (a :class:`race.accounting.PolicyCost`) (the rule: :func:`race.accounting.rollout.executed_rollout`), ``d`` decoded
    tokens per row (``T`` for every row when rows were not dropped)."""
    from race.accounting.rollout import executed_rollout

    decoded = [ro.completion_len] * len(ro.lengths) if ro.decoded is None else [int(d) for d in ro.decoded.tolist()]
    return executed_rollout(policy, ro.prompt_len, ro.n_prompts, decoded, merged=ro.merged)


def _sample(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, group: int, max_new_tokens: int,
           eos_id: int, pad_id: int, temperature: float = 1.0, greedy: "bool | torch.Tensor" = False,
           generator: torch.Generator | None = None, fast: bool | None = None,
           merge_lora: bool | None = None, drop_finished: bool = True) -> Rollout:
    """Sample ``group`` completions for each prompt row (see module docstring).

    ``fast``: use the functional decoder (``race.engines.kernels.fast_decode``) instead of the HF
    forward; default: whenever the architecture supports it. Both execute the same FLOPs.
    ``merge_lora`` (functional decoder only): fold LoRA into the weights for this rollout
    (refused on a bfloat16/float16 base); default: when the base holds the folded delta and
    merging executes fewer FLOPs at full length (module docstring).
    ``drop_finished`` (functional decoder only): finished rows leave the batch (module docstring).
    ``greedy``: a bool for every row, or a (n_prompts * group,) bool tensor choosing argmax
    per row (one decode loop for greedy and sampled evaluation rows alike); sampled rows
    draw from ``generator`` as they would alone only when no row is greedy."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    if fast is None:
        fast = FastDecoder.supports(model)
    mask = prompt_mask.repeat_interleave(group, dim=0)
    if fast:
        dec, logits, merged = _fast_prefill(model, prompt_ids, prompt_mask, group, max_new_tokens, merge_lora)
        step = dec.decode
    else:
        dec, merged = None, False
        logits, step = _hf_prefill(model, prompt_ids, prompt_mask, mask, group)
    if group > 1:
        logits = logits.repeat_interleave(group, dim=0)
    greedy, row_greedy = _greedy_rows(greedy, mask.shape[0], prompt_ids.device)
    comp, decoded = _decode(logits, step, positions(mask)[:, -1], max_new_tokens, eos_id, pad_id, temperature, greedy,
                            row_greedy, generator, dec if fast and drop_finished else None)
    cmask, truncated = completion_mask(comp, eos_id)
    return Rollout(prompt_ids=prompt_ids.repeat_interleave(group, dim=0), prompt_mask=mask, completion_ids=comp,
                   completion_mask=cmask, truncated=truncated, n_prompts=prompt_ids.shape[0], group=group,
                   merged=merged, decoded=decoded if fast else None)


def _fast_prefill(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group: int, max_new_tokens: int,
                  merge_lora: bool | None) -> tuple[FastDecoder, torch.Tensor, bool]:
    """(the functional decoder after the prompts' prefill, expanded to ``group`` rows per
    prompt; the last position's logits per prompt; whether LoRA was merged for this rollout)."""
    n_prompts, P = prompt_ids.shape
    dec, merged = FastDecoder(model), False
    if merge_lora is None:  # every position a full-length rollout runs: prefill + decode
        merge_lora = dec.should_merge(n_prompts * P + n_prompts * group * (max_new_tokens - 1))
    if merge_lora and dec.lora_dims():
        dec.merge_lora()
        merged = True
    logits = dec.prefill(prompt_ids, prompt_mask, P + max_new_tokens)
    dec.expand(group)
    return dec, logits, merged


def _hf_prefill(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, mask: torch.Tensor,
                group: int) -> tuple[torch.Tensor, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """(the last position's logits per prompt after the HF forward's prefill, the decode step:
    (tokens, positions) -> next logits on the model's KV cache, repeated ``group`` times)."""
    cache_kw = _cache_kwarg(model)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                use_cache=True, logits_to_keep=1)
    state = {"cache": getattr(out, cache_kw), "mask": mask}
    if group > 1:
        state["cache"].batch_repeat_interleave(group)

    def step(tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        m = state["mask"]
        state["mask"] = torch.cat([m, torch.ones(m.shape[0], 1, dtype=m.dtype, device=m.device)], dim=1)
        o = model(input_ids=tok[:, None], attention_mask=state["mask"], position_ids=pos[:, None], use_cache=True,
                  **{cache_kw: state["cache"]})
        state["cache"] = getattr(o, cache_kw)
        return o.logits[:, -1, :]

    return out.logits[:, -1, :], step


def _greedy_rows(greedy: "bool | torch.Tensor", rows: int, dev: Any) -> tuple[bool, torch.Tensor | None]:
    """(greedy for every row, a per-row mask or None): a mask that is all one thing becomes
    the bool; a mask of the wrong shape is refused."""
    row_greedy = greedy if isinstance(greedy, torch.Tensor) else None
    if row_greedy is not None:
        if row_greedy.shape != (rows,):
            raise ValueError(f"greedy mask of shape {tuple(row_greedy.shape)}: need one flag per row ({rows},)")
        row_greedy = row_greedy.to(device=dev, dtype=torch.bool)
        if bool(row_greedy.all()) or not bool(row_greedy.any()):
            greedy, row_greedy = bool(row_greedy.all()), None
    return bool(greedy) if row_greedy is None else False, row_greedy


def _decode(logits: torch.Tensor, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], pos: torch.Tensor,
            max_new_tokens: int, eos_id: int, pad_id: int, temperature: float, greedy: bool,
            row_greedy: torch.Tensor | None, generator: torch.Generator | None,
            dropper: FastDecoder | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode loop from the prefill's ``logits``: ((B, T) completion tokens, pad after
    EOS; (B,) tokens each row produced in the batch). Rows stop at EOS (padded after it) and
    the loop when every row has or at ``max_new_tokens``; with ``dropper`` (the functional
    decoder) finished rows leave the batch once they are an eighth of it."""
    B, dev = logits.shape[0], logits.device
    comp = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    live: torch.Tensor | None = None  # original indices of the rows still in the batch; None: all of them
    decoded = torch.zeros(B, dtype=torch.long, device=dev)  # tokens each row produced in the batch
    done = torch.zeros(B, dtype=torch.bool, device=dev)  # per row in the batch: produced EOS
    T = 0
    for t in range(max_new_tokens):
        if row_greedy is None and greedy:
            nxt = logits.argmax(-1)
        else:  # uniforms for every row, in the batch or not: the same draws whichever rows were dropped
            u = uniforms(B, generator, dev)
            nxt = draw(logits, temperature, u=u if live is None else u[live])
            if row_greedy is not None:
                nxt = torch.where(row_greedy, logits.argmax(-1), nxt)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        comp[slice(None) if live is None else live, t] = nxt
        T = t + 1
        done = done | (nxt == eos_id)
        n_done = int(done.sum())
        if n_done == done.shape[0] or t == max_new_tokens - 1:
            break
        if dropper is not None and n_done * 8 >= done.shape[0]:  # drop the finished rows (module docstring)
            rows = torch.arange(B, device=dev) if live is None else live
            decoded[rows[done]] = T  # they leave having produced T tokens in the batch
            keep = (~done).nonzero().squeeze(1)
            live, nxt, pos, done = rows[keep], nxt[keep], pos[keep], done[keep]
            if row_greedy is not None:
                row_greedy = row_greedy[keep]
            dropper.select(keep)
        pos = pos + 1
        logits = step(nxt, pos)
    decoded[slice(None) if live is None else live] = T  # the rows in the batch to the end
    return comp[:, :T], decoded


def completion_mask(comp: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """((B, T) mask of each row's tokens up to and including its first EOS, (B,) truncated:
    the rows without an EOS)."""
    is_eos = comp == eos_id
    has_eos = is_eos.any(1)
    first_eos = torch.where(has_eos, is_eos.float().argmax(1), torch.full_like(has_eos, comp.shape[1], dtype=torch.long))
    ar = torch.arange(comp.shape[1], device=comp.device)[None, :]
    return (ar <= first_eos[:, None]).long(), ~has_eos


def uniforms(rows: int, generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """(rows, 1) uniforms drawn on ``generator``'s own device (a CPU generator drives a
    CUDA run: the same draws on every device, and torch refuses a CPU generator for a CUDA
    tensor), then moved to ``device``."""
    where = generator.device if generator is not None else device
    return torch.rand(rows, 1, generator=generator, device=where).to(device)


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None,
         u: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from ``softmax(logits / temperature)`` by inverting its CDF at a
    uniform draw: the distribution of ``torch.multinomial(probs, 1)``, about 7x faster on
    a CPU for a (rows x vocab) block (multinomial draws an exponential per entry). A
    zero-probability token is never drawn (``right=True`` skips flat CDF steps). ``u``
    (rows, 1): the uniforms to use instead of drawing them from ``generator``."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    cdf = probs.cumsum(-1)
    if u is None:
        u = uniforms(probs.shape[0], generator, probs.device)
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def step_charge(roll: dict[str, int], reward: Any, learn: dict[str, int], ro: "Rollout",
                group: int) -> tuple[dict[str, int], dict[str, int]]:
    """One GRPO step's ledger entries, as both engines charge them: the ``phase/component``
    FLOPs (rollout, ``reward``'s components, else ``reward/score`` at 0, then the learning
    passes) and the tokens each phase processed (decoded completion tokens; prompt tokens
    once per group, as the prefill shares them; the reward model's scored tokens)."""
    comps = dict(roll)
    comps.update(reward.components or {})
    comps.update(learn)
    tokens = {"rollout/decode": int(ro.lengths.sum()), "rollout/prefill": int(ro.prompt_mask[::group].sum())}
    if reward.tokens:
        tokens[next(iter(reward.components), "reward/score")] = reward.tokens
    if not reward.components:
        comps["reward/score"] = 0
    return comps, tokens


def decode_completions(tokenizer: Any, rollout: Rollout) -> list[str]:
    """Completion texts (EOS and padding removed)."""
    texts = []
    for row, m in zip(rollout.completion_ids.tolist(), rollout.completion_mask.tolist()):
        kept = [tok for tok, keep in zip(row, m) if keep and tok != tokenizer.eos_token_id]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return texts
