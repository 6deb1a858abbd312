"""The TRL drop-in under TRL's tool-calling loop: the prompt bound renders the tools, and
the step bound covers the re-generations of ``_tool_call_loop`` (a tool-calling step costs
more than one turn, which a single-turn bound misses)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

#: a prefix-preserving chat template that renders tools, tool calls and tool results
TEMPLATE = (
    "{%- if tools %}T:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}U:{{ m.content }}\n"
    "{%- elif m.role == 'assistant' %}A:{{ m.content }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>{{ {'name': tc.function.name, "
    "'arguments': tc.function.arguments} | tojson }}</tool_call>{% endfor %}\n"
    "{%- elif m.role == 'tool' %}R:{{ m.content }}\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}A:{% endif %}"
)
CALL = "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}, separators=(",", ":")) + "</tool_call>"


def parse_calls(tok, ids) -> dict:
    """The response parser (stands for a model's ``response_template``): ``<tool_call>{json}</tool_call>``."""
    text = tok.decode(ids, skip_special_tokens=True)
    calls = [json.loads(m) for m in re.findall(r"<tool_call>(.+?)</tool_call>", text)]
    out = {"role": "assistant", "content": re.sub(r"<tool_call>.+?</tool_call>", "", text)}
    if calls:
        out["tool_calls"] = [{"type": "function", "function": c} for c in calls]
    return out


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


class ToolServer:
    """Stands for TRL's VLLMGeneration: a first turn calls ``add``; after the tool result the
    answer is ``3``. Token ids only (the hooked model does not run), so the rows are charged
    from their ids."""

    def __init__(self, tok) -> None:
        self.tok, self.turns = tok, []

    def sync_weights(self) -> None:
        pass

    def generate(self, prompts, images, num_generations, profiler=None):
        result = self.tok(text="R:")["input_ids"]
        out = []
        for p in prompts:
            after_tool = any(p[i:i + len(result)] == result for i in range(len(p)))
            out.append(self.tok(text="3" if after_tool else CALL)["input_ids"] + [self.tok.eos_token_id])
        self.turns.append((len(prompts), max(map(len, prompts))))
        return prompts, out, [[[0.0] for _ in c] for c in out], None


def _trainer(model_dir, out, T: int):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(str(model_dir), device="cpu", attn_implementation="eager")
    tok.chat_template = TEMPLATE
    tok.response_schema = {"parsed by": "parse_calls"}  # TRL parses tool calls when the tokenizer has a parser
    tok.parse_response = lambda ids, **kw: parse_calls(tok, ids)
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=T, max_steps=2, report_to="none", disable_tqdm=True, save_strategy="no",
                      activation_checkpointing=False, seed=0, max_tool_calling_iterations=2)
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+2?"}], [{"role": "user", "content": "1+2=?"}]] * 4})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=ds, processing_class=tok, tools=[add])
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, ToolServer(tok), -1
    trainer.vllm_mode, trainer.vllm_importance_sampling_correction = "server", False
    return trainer, tok


def test_tool_calling_steps_stay_within_the_multi_turn_bound(tiny_model_dir, tmp_path):
    from race.accounting import AccountingError
    from race.engines.trl_callback import add_race_accounting

    T = 80
    trainer, tok = _trainer(tiny_model_dir, tmp_path / "a", T)
    cb = add_race_accounting(trainer, budget_flops=1e13)
    trainer.train()
    server = trainer.vllm_generation
    assert [n for n, _ in server.turns] == [4, 4, 4, 4]  # per step: the first turn, then every row once more
    # the prompt bound renders the tools, as TRL does: it is the longest first-turn prompt
    rendered = tok.apply_chat_template([{"role": "user", "content": "1+2=?"}], tools=[add], tokenize=True,
                                       add_generation_prompt=True, return_dict=True)["input_ids"]
    bare = tok.apply_chat_template([{"role": "user", "content": "1+2=?"}], tokenize=True, add_generation_prompt=True,
                                   return_dict=True)["input_ids"]
    assert cb.max_prompt_length == len(rendered) > len(bare) and max(p for _, p in server.turns[::2]) <= len(rendered)
    assert cb.plan.tool_iterations == 2
    single = replace(cb.plan, tool_iterations=0)
    multi_bound = cb.step_bound(0, buffered=False)
    cb.plan, multi_plan = single, cb.plan
    single_bound = cb.step_bound(0, buffered=False)
    cb.plan = multi_plan
    steps = {s: sum(r.flops for r in cb.ledger if r.counted and r.step == s) for s in (1, 2)}
    for s, cost in steps.items():
        assert single_bound < cost <= multi_bound, s  # only the multi-turn bound covers a tool step
    assert not [r for r in cb.ledger if r.phase == "overrun"]
    # a budget the single-turn bound would have started a step under: refused before any step
    trainer2, _ = _trainer(tiny_model_dir, tmp_path / "b", T)
    budget = (single_bound + min(steps.values())) / 2
    with pytest.raises(AccountingError, match="smaller than one TRL step"):
        add_race_accounting(trainer2, budget_flops=budget)
        trainer2.train()
