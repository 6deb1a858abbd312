"""Step-0 probe: SmolLM2-135M-Instruct's greedy accuracy on the arith-qa test problems under
candidate prompt formats and completion lengths, before any training (how the task of
configs/smollm2-gain.yaml was chosen: a step-0 accuracy that leaves room, roughly 0.2-0.6).

    .venv/bin/python benchmarks/smollm2_probe.py [--n 200] [--lengths 24,48] [--threads 2]

Needs ``race base import smollm2``. Greedy decoding with the built-in engine's sampler (the
evaluation's code path), answers checked by ``reward: rule``'s verifier. Prints, per format
and length: accuracy, the share of completions cut at the length, and the prompt's tokens.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
#: name -> (prompt_template, chat_template, system_prompt)
FORMATS = {
    "chat, 'Give only the final number.'": ("{question} Give only the final number.", True, None),
    "chat, bare question": ("{question}", True, None),
    "chat, system 'Answer with the number only.'": ("{question}", True, "Answer with the number only."),
    "chat, 'Write the final answer after ####.'": ("{question} Write the final answer after ####.", True, None),
    "plain 'Question: ...\\nAnswer:'": ("Question: {question}\nAnswer:", False, None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="test problems (the first n of configs/data/arith-qa/test.jsonl)")
    ap.add_argument("--lengths", default="24,48")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch

    from race.engines.sampling import decode_completions, encode_prompts, sample
    from race.models.loading import load_policy
    from race.tasks.files import completion_answer, answers_match
    from race.tasks.prompts import PromptFormat

    torch.set_num_threads(a.threads)
    model, tok = load_policy("smollm2-135m", device="cpu", dtype="float32", attn_implementation="sdpa")
    rows = [json.loads(x) for x in (ROOT / "configs/data/arith-qa/test.jsonl").read_text().splitlines()[:a.n]]
    answers = [r["answer"].removeprefix("#### ") for r in rows]
    print(f"SmolLM2-135M-Instruct, {a.n} test problems, greedy, {a.threads} thread(s)\n")
    print("| format | completion tokens | greedy accuracy | cut at the length | prompt tokens | seconds |")
    print("|---|---|---|---|---|---|")
    for name, (template, chat, system) in FORMATS.items():
        fmt = PromptFormat(template, chat=chat, system_prompt=system, tokenizer=tok)
        ids, mask = encode_prompts(tok, [fmt.render(r["question"]) for r in rows], "cpu")
        for length in (int(x) for x in a.lengths.split(",")):
            t0 = time.perf_counter()
            ro = sample(model, ids, mask, group=1, max_new_tokens=length, eos_id=tok.eos_token_id,
                        pad_id=tok.pad_token_id, temperature=1.0, greedy=torch.ones(len(rows), dtype=torch.bool),
                        generator=torch.Generator().manual_seed(0))
            texts = decode_completions(tok, ro)
            ok = sum(bool((g := completion_answer(t)) and answers_match(g, y)) for t, y in zip(texts, answers))
            cut = float(ro.truncated.float().mean())
            print(f"| {name} | {length} | {ok / len(rows):.3f} | {cut:.2f} | {ids.shape[1]} | "
                  f"{time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
