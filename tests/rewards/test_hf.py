"""Real reward models from local HF directories (no trust_remote_code): a
SequenceClassification ORM, a Qwen2.5-Math-PRM-style PRM (TokenClassification with an
``<extra_0>`` step separator, and the Qwen2ForProcessRewardModel weight layout), each a
tiny stand-in saved to a temporary directory."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from race.rewards import make_reward
from race.tasks import solution_text

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def _tokenizer(extra: bool, chat: bool):
    from race.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    if extra:
        tok.add_special_tokens({"additional_special_tokens": ["<extra_0>"]})
    if chat:
        tok.chat_template = CHAT
    return tok


def _config(vocab: int, **kw):
    from transformers import Qwen2Config

    cfg = Qwen2Config(vocab_size=vocab, pad_token_id=0, eos_token_id=1, **SMALL, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def _save(model, tok, path):
    torch.manual_seed(0)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def orm_dir(tmp_path_factory):
    from transformers import Qwen2ForSequenceClassification

    tok = _tokenizer(False, False)
    torch.manual_seed(0)
    return _save(Qwen2ForSequenceClassification(_config(len(tok), num_labels=1)), tok,
                 tmp_path_factory.mktemp("orm"))


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from transformers import Qwen2ForTokenClassification

    tok = _tokenizer(True, True)
    torch.manual_seed(1)
    return _save(Qwen2ForTokenClassification(_config(len(tok), num_labels=2)), tok, tmp_path_factory.mktemp("prm"))


@pytest.fixture(scope="module")
def qwen_prm_dir(tmp_path_factory):
    """Qwen2.5-Math-PRM's own layout: Qwen2Model weights under ``model.`` and a
    ``score`` = Linear(h, h) -> ReLU -> Linear(h, 2); config names the remote-code class."""
    from safetensors.torch import save_file
    from transformers import Qwen2Model

    tok = _tokenizer(True, True)
    path = tmp_path_factory.mktemp("qwen-prm")
    torch.manual_seed(2)
    cfg = _config(len(tok))
    body = Qwen2Model(cfg)
    head = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    state = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()}
    state.update({f"score.{k}": v.contiguous() for k, v in head.state_dict().items()})
    save_file(state, str(path / "model.safetensors"))
    d = cfg.to_dict()
    d.update(architectures=["Qwen2ForProcessRewardModel"],
             auto_map={"AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel"})
    (path / "config.json").write_text(json.dumps(d))
    tok.save_pretrained(path)
    return path


def _measured(reward, problems, texts):
    with FlopCounterMode(display=False) as fc:
        out = reward.score(problems, texts)
    return out, fc.get_total_flops()


def test_hf_orm_scores_the_last_token_like_hf_does(orm_dir, arith):
    from transformers import AutoModelForSequenceClassification

    r = make_reward(f"orm:{orm_dir}", device="cpu", conventions="torch")
    assert r.scorer.shape.head == ((32, 1),)
    problems = arith.problems("test", 4, seed=0)
    texts = [solution_text(p) for p in problems]
    out, measured = _measured(r, problems, texts)
    assert out.flops == measured and out.components["reward/head"] == 4 * 2 * 32
    ref = AutoModelForSequenceClassification.from_pretrained(orm_dir, attn_implementation="eager").eval()
    ids = r.scorer.tokenizer(problems[0].prompt + texts[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = torch.sigmoid(ref(ids).logits[0, 0]).item()
    assert out.rewards[0] == pytest.approx(want, abs=1e-5)


def test_hf_prm_reads_the_separators_in_one_forward(prm_dir, arith):
    from transformers import AutoModelForTokenClassification

    r = make_reward(f"prm:{prm_dir}:last", device="cpu", conventions="torch")
    p = arith.problems("test", 2, seed=0)
    texts = ["First 2+3=5.\n\nThen 5+1=6.\n\nSo \\boxed{6}", "one step only <extra_0> with a fake separator"]
    out, measured = _measured(r, p, texts)
    assert out.flops == measured
    assert out.components["reward/head"] == (3 + 1) * 2 * 32 * 2  # 3 + 1 separators inserted, 2 labels
    prefix, body = r.scorer.render(p[0], texts[0])
    assert prefix.startswith("<system>Please reason step by step") and prefix.endswith("<assistant>")
    assert body.count("<extra_0>") == 3 and "\n\n" not in body
    ref = AutoModelForTokenClassification.from_pretrained(prm_dir, attn_implementation="eager").eval()
    ids = r.scorer.tokenizer(prefix + body, return_tensors="pt", add_special_tokens=False)["input_ids"]
    sep = r.scorer.tokenizer.convert_tokens_to_ids("<extra_0>")
    with torch.no_grad():
        probs = torch.softmax(ref(ids).logits[0], -1)[:, 1]
    want = probs[ids[0] == sep].tolist()
    assert len(want) == 3 and out.rewards[0] == pytest.approx(want[-1], abs=1e-5)
    mn = make_reward(f"prm:{prm_dir}", device="cpu").score(p[:1], texts[:1])
    assert mn.rewards[0] == pytest.approx(min(want), abs=1e-5)


def test_qwen_process_reward_model_layout_loads_without_remote_code(qwen_prm_dir, arith):
    r = make_reward(f"prm:{qwen_prm_dir}", device="cpu", conventions="torch")
    assert r.scorer.shape.head == ((32, 32), (32, 2)) and r.scorer.shape.head_bias
    p = arith.problems("test", 3, seed=1)
    out, measured = _measured(r, p, ["a\n\nb\n\nc", "x", ""])
    assert out.flops == measured
    assert out.components["reward/head"] == 4 * (2 * 32 * 32 + 2 * 32 * 2)
    assert out.rewards[2] == 0.0  # no step, no process reward


def test_race_built_rm_loads_by_path(built_rms, arith):
    path = built_rms["prm-xs"].path
    by_name = make_reward("prm:prm-xs", device="cpu")
    by_path = make_reward(f"prm:{path}", device="cpu")
    p = arith.problems("test", 3, seed=2)
    texts = [solution_text(x) for x in p]
    assert by_name.score(p, texts).rewards == by_path.score(p, texts).rewards


def test_clear_errors(tmp_path, orm_dir, tiny_model_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_reward(f"orm:{tmp_path / 'nope'}", device="cpu")
    with pytest.raises(ValueError, match="cannot serve as an ORM"):
        make_reward(f"orm:{tiny_model_dir}", device="cpu")
    with pytest.raises(ValueError, match="cannot serve as a PRM"):
        make_reward(f"prm:{orm_dir}", device="cpu")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        make_reward(f"orm:{tmp_path}", device="cpu")


def test_prm_without_a_separator_token_says_how_to_set_one(tmp_path):
    from transformers import Qwen2ForTokenClassification

    tok = _tokenizer(False, False)
    _save(Qwen2ForTokenClassification(_config(len(tok), num_labels=2)), tok, tmp_path)
    with pytest.raises(ValueError, match="race_rm.json"):
        make_reward(f"prm:{tmp_path}", device="cpu")
    (tmp_path / "race_rm.json").write_text(json.dumps({"markers": [";"]}))
    assert make_reward(f"prm:{tmp_path}", device="cpu").scorer.markers


def test_rm_tokenizer_keeps_every_character(built_rms):
    """AutoTokenizer would load the char tokenizer of a Qwen2-config directory as a
    Qwen2Tokenizer that drops spaces and newlines; the RM loader must not."""
    from pathlib import Path

    from race.rewards.hf import load_rm_tokenizer

    tok = load_rm_tokenizer(Path(built_rms["prm-xs"].path))
    text = "Q:1+2\nA: 1+2=3;#3."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_template_tokens_of_a_chat_prm_are_in_the_bound(prm_dir, arith, char_tokenizer):
    """A Qwen2.5-Math-PRM-style PRM wraps the problem in a chat template with a system
    prompt and writes a separator after each step: all of it is read, all of it is bounded."""
    problems = [dataclasses.replace(p, prompt="Solve carefully. " * 4 + p.prompt) for p in arith.problems("test", 6, seed=2)]
    T = 30
    texts = [solution_text(p).replace(";", ";\n\n")[:T] for p in problems]
    r = make_reward(f"prm:{prm_dir}", device="cpu", tokenizer=char_tokenizer)
    assert r.scorer.inserts_markers
    used = r.score(problems, texts).flops
    P = max(len(p.prompt) for p in problems)  # even the whole policy prompt misses the template
    assert r.step_bound(6, P, T) < used <= r.step_bound(6, P, T, problems=problems)
