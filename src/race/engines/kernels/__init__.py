"""The kernels every engine's forward passes may use: the functional KV-cache decoder
(``fast_decode``: the built-in rollout, the gang's batched decode) and the fused
log-prob forward (``fast_forward``: the built-in learning passes, the gang's). Torch only:
nothing here knows a run, a ledger or an engine, so ``race.engines``' shared modules
(``sampling``, ``grpo_math``) and each engine import them from here."""
