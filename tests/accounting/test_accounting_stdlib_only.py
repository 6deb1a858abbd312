"""race.accounting (and the stdlib-only floors above it, race.schema and race.cards) imports nothing
outside the standard library (docs/design.md section 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import race

PROBE = r"""
import json, sys, sysconfig, os
before = set(sys.modules)
import race.accounting
import race.accounting.budget, race.accounting.conventions, race.accounting.errors, race.accounting.grpo
import race.accounting.ledger, race.accounting.lora, race.accounting.passes, race.accounting.report_card
import race.accounting.shapes, race.accounting.terms, race.accounting.guard, race.accounting.trl_step
import race.accounting.trl_compare, race.accounting.devices, race.schema, race.cards
race.accounting.ModelShape.from_preset("qwen2.5-7b")  # also loads the packaged shapes data
new = sorted(set(sys.modules) - before)
stdlib_dirs = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
out = []
for name in new:
    mod = sys.modules[name]
    f = getattr(mod, "__file__", None)
    out.append([name, os.path.realpath(f) if f else None])
print(json.dumps({"modules": out, "stdlib_dirs": sorted(stdlib_dirs), "stdlib_names": sorted(sys.stdlib_module_names)}))
"""


def test_accounting_imports_only_the_standard_library():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    info = json.loads(res.stdout)
    race_dir = str(Path(race.__file__).resolve().parent)
    stdlib_dirs = info["stdlib_dirs"]
    stdlib_names = set(info["stdlib_names"])
    offenders = []
    for name, path in info["modules"]:
        top = name.split(".")[0]
        if top == "race":
            assert path is None or path.startswith(race_dir), (name, path)
            # the stdlib-only floors: the accounting, the tables' layout, the card's rendering
            assert name in ("race", "race.schema", "race.cards") or name.startswith("race.accounting"), \
                f"race.accounting imported {name}"
            continue
        in_stdlib_dir = path is None or any(path.startswith(d) and "site-packages" not in path for d in stdlib_dirs)
        if top not in stdlib_names or not in_stdlib_dir:
            offenders.append((name, path))
    assert not offenders, f"race.accounting imported non-stdlib modules: {offenders}"
    names = {n for n, _ in info["modules"]}
    assert not names & {"torch", "numpy", "transformers", "pydantic", "yaml", "typer", "rich", "peft", "pandas"}
