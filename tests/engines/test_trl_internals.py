"""TRL internals are read in one module, behind a version check with errors that say what
to do; what cannot be seen without the trainer is refused."""

from __future__ import annotations

import types

import pytest


def _gen(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    return [[7] * len(p) for p in prompt_ids], None


def test_check_trl_refuses_old_versions_and_missing_internals():
    from race.accounting import AccountingError
    from race.engines.trl.internals import check_trl

    with pytest.raises(AccountingError, match=r"needs trl >= 1\.16.*found trl 1\.15\.2: upgrade trl"):
        check_trl(version="1.15.2")
    check_trl(version="1.16.0")
    ok = types.SimpleNamespace(_buffered_inputs=None, _generate_single_turn=types.MethodType(_gen, object()))
    with pytest.warns(UserWarning, match=r"tested with trl 1\.16; found trl 2\.0\.0.*pin trl==1\.16\.\*"):
        check_trl(ok, version="2.0.0")  # newer: accepted when the internals are there, with a warning
    lacking = types.SimpleNamespace(_step=0)
    with pytest.raises(AccountingError, match=r"trl 2\.0\.0: GRPOTrainer has no _buffered_inputs, "
                                              r"_generate_single_turn.*install trl==1\.16\.\*"):
        check_trl(lacking, version="2.0.0")


def test_check_trl_reads_signatures_and_warns_once_per_untested_version():
    """``_generate_single_turn`` changed its parameters between TRL releases: one that takes
    others is refused (hasattr alone would accept it); ``_step`` is not needed any more (the
    micro-steps come from callback events)."""
    import warnings

    from race.accounting import AccountingError
    from race.engines.trl.internals import check_trl

    def old_style(self, prompts, images, num_generations):  # an earlier TRL's parameters
        return [], None

    changed = types.SimpleNamespace(_buffered_inputs=None, _generate_single_turn=types.MethodType(old_style, object()))
    with pytest.raises(AccountingError, match=r"_generate_single_turn\('prompts', 'images', 'num_generations'\) "
                                              r"does not take \(prompt_ids, images, multimodal_fields, "
                                              r"num_generations, \.\.\.\).*install trl==1\.16\.\*"):
        check_trl(changed, version="1.16.0")
    class Base:
        _buffered_inputs = None
        _generate_single_turn = _gen

    class PassThrough(Base):  # a user's override that passes everything on: the base's parameters count
        def _generate_single_turn(self, *args, **kwargs):
            return super()._generate_single_turn(*args, **kwargs)

    check_trl(PassThrough(), version="1.16.0")
    Base._generate_single_turn = old_style
    with pytest.raises(AccountingError, match="does not take"):
        check_trl(PassThrough(), version="1.16.0")
    no_step = types.SimpleNamespace(_buffered_inputs=None, _generate_single_turn=types.MethodType(_gen, object()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_trl(no_step, version="1.16.3")  # the tested minor version: no warning, no _step needed
    with pytest.warns(UserWarning, match="1.17.0.dev0"):
        check_trl(version="1.17.0.dev0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_trl(version="1.17.0.dev0")  # once per version


def test_real_trainer_signature_is_accepted():
    import inspect

    from trl import GRPOTrainer

    from race.engines.trl.internals import GENERATION_PARAMS

    params = list(inspect.signature(GRPOTrainer._generate_single_turn).parameters)
    assert tuple(params[1:1 + len(GENERATION_PARAMS)]) == GENERATION_PARAMS


def test_private_reads_and_the_generation_wrapper():
    from race.engines.trl.internals import has_buffered_batch, micro_step, wrap_generation

    class Trainer:
        _step, _buffered_inputs = 5, None

        def _generate_single_turn(self, prompt_ids, *rest):
            return [[7] * len(p) for p in prompt_ids], None

    t = Trainer()
    assert micro_step(t) == 5 and not has_buffered_batch(t) and micro_step(object()) is None
    seen = []

    def observe(original, args, kwargs):
        seen.append(args[0])
        return original(*args, **kwargs)

    undo = wrap_generation(t, observe)
    assert t._generate_single_turn([[1, 2]], None, {}, 4) == ([[7, 7]], None) and seen == [[[1, 2]]]
    undo()
    assert "_generate_single_turn" not in t.__dict__ and t._generate_single_turn([[1]])[0] == [[7]]


def test_callback_in_callbacks_list_refuses_generation_it_cannot_see(tmp_path):
    from race.accounting import AccountingError
    from race.engines.trl_callback import RaceFlopCallback

    for flag in ("use_vllm", "use_transformers_continuous_batching"):
        args = types.SimpleNamespace(**{flag: True}, output_dir=str(tmp_path))
        with pytest.raises(AccountingError, match="add_race_accounting"):
            RaceFlopCallback(1e12).on_train_begin(args, types.SimpleNamespace(global_step=0), None)


def test_world_size_without_a_process_group_is_refused():
    from race.accounting import AccountingError
    from race.engines.trl.distributed import world

    assert world() == (0, 1)
    with pytest.raises(AccountingError, match="accelerate launch / torchrun"):
        world(types.SimpleNamespace(world_size=2))


def test_the_vllm_multi_gpu_script_of_docs_trl_md_uses_real_names():
    """The docs' vLLM + accelerate script: its GRPOConfig / LoraConfig keywords are fields
    of TRL's and PEFT's configs, and it adds RACE with the one-line call."""
    import ast
    import dataclasses
    import re
    from pathlib import Path

    from peft import LoraConfig
    from trl import GRPOConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "trl.md").read_text()
    (code,) = [c for c in re.findall(r"```python\n(.*?)```", text, re.S) if "accelerate launch" in c]
    calls = {n.func.id: n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    fields = {"GRPOConfig": {f.name for f in dataclasses.fields(GRPOConfig)},
              "LoraConfig": {f.name for f in dataclasses.fields(LoraConfig)}}
    for name, known in fields.items():
        kws = {k.arg for k in calls[name].keywords}
        assert kws <= known, (name, kws - known)
    grpo = {k.arg: ast.literal_eval(k.value) for k in calls["GRPOConfig"].keywords}
    assert grpo["use_vllm"] is True and grpo["vllm_mode"] == "colocate"
    assert "accelerate launch --num_processes 4 train.py" in code
    assert [k.arg for k in calls["add_race_accounting"].keywords] == ["budget_flops"]
