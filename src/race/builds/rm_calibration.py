"""Fitting a likelihood PRM (or ORM): the calibration of
:mod:`race.rewards.rm_likelihood`'s logistic map on a recipe's policy-sample pool.

:func:`fit_likelihood` reads the warm start of ``recipe.backbone`` (built first when
missing), computes the step features at every marker of the pool and fits ``(w, b)`` by
:func:`calibrate`; :func:`race.builds.rm_training.build_rm` publishes the result. The
scoring model itself, its features and its loader are ``race.rewards.rm_likelihood``'s.
"""

from __future__ import annotations

from race.accounting.reward_kinds import reward_kind

from typing import Any

from race.rewards.rm_likelihood import N_FEATURES, boundary_ids, likelihood_model, set_calibration


def calibrate(features: Any, labels: Any, iterations: int) -> tuple[list[float], float]:
    """Class-balanced logistic regression of ``labels`` [N] on ``features`` [N, 2]
    (L-BFGS on standardised features, mapped back): ``(w, b)``."""
    import torch

    x = features.double()
    y = labels.double()
    mu, sd = x.mean(0), x.std(0).clamp(min=1e-6)
    z = (x - mu) / sd
    n, n_pos = len(y), float(y.sum())
    wts = torch.where(y > 0.5, n / (2 * max(1.0, n_pos)), n / (2 * max(1.0, n - n_pos)))
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> Any:
        opt.zero_grad()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y, reduction="none") * wts).mean()
        loss = loss + 1e-4 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w_raw = (w / sd).detach()
    b_raw = (b - (w * mu / sd).sum()).detach()
    return [float(v) for v in w_raw], float(b_raw)


def fit_likelihood(recipe: Any, pool: Any, *, cache_dir: Any = None, batch_size: int = 128) -> dict[str, Any]:
    """Calibrate a likelihood PRM (or ORM: labels = final-answer correctness at the last
    token) on ``pool`` (policy samples): the warm start of
    ``recipe.backbone`` wrapped by :func:`likelihood_model`, ``(w, b)`` from
    :func:`calibrate`. Returns the model, the LM, its tokenizer, where the LM came from
    and the stats ``info.json`` records (``train_flops``: the forward passes over the
    pool with logits at every position, i.e. what executed)."""
    import torch

    from race.accounting import forward_flops
    from race.models.loading import load_policy
    from race.models.refs import model_shape
    from race.builds.rm_data import marker_labels
    from race.builds.warmstart import build_base
    from race.rewards.rm_encoding import MAX_LENGTH, encode
    from race.tasks.verify import verify

    base = build_base(recipe.backbone, cache_dir=cache_dir)
    lm, tok = load_policy(base.path, device="cpu", dtype="float32")
    model = likelihood_model(lm, boundary_ids(tok, recipe.kind), [0.0] * N_FEATURES, 0.0)
    shape = model_shape(lm)
    feats, labels = [], []
    stats = dict(tokens_processed=0, real_tokens=0, scored_positions=0, train_flops=0)
    with torch.no_grad():
        for i in range(0, len(pool), batch_size):
            chunk = pool[i: i + batch_size]
            batch = encode(tok, [p.prompt for p, _ in chunk], [c for _, c in chunk], recipe.kind,
                           max_length=MAX_LENGTH)
            f = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 position_ids=batch["position_ids"]).last_hidden_state
            feats.append(f[batch["rows"], batch["cols"]])
            for (p, c), k in zip(chunk, batch["counts"]):
                lab = marker_labels(p, c) if reward_kind(recipe.kind).per_step else [int(verify(p, c).correct)]
                labels.extend((lab + [0] * k)[:k])
            B, L = batch["input_ids"].shape
            stats["tokens_processed"] += B * L
            stats["real_tokens"] += int(batch["attention_mask"].sum())
            stats["scored_positions"] += int(sum(batch["counts"]))
            stats["train_flops"] += forward_flops(shape, [L] * B, logits="all")
    x, y = torch.cat(feats), torch.tensor(labels, dtype=torch.float64)
    weight, bias = calibrate(x, y, recipe.steps)
    set_calibration(model, weight, bias)
    logit = x.double() @ torch.tensor(weight, dtype=torch.float64) + bias
    loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logit, y))
    origin = dict(init="base", base_path=base.path, base_recipe_hash=base.recipe_hash, base_sft_flops=base.sft_flops,
                  base_test_accuracy=base.test_accuracy, calibration=dict(weight=weight, bias=bias))
    return dict(model=model, lm=lm, tokenizer=tok, origin=origin, stats=dict(stats, final_loss=loss),
                shape=shape)
