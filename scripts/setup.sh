#!/usr/bin/env bash
# Create .venv (if missing) and install RACE with every extra the demo and tests need.
# CPU installs pin torch==2.13.0 (an unpinned torch may pull a multi-GB CUDA build);
# a torch that is already importable in the venv (e.g. a GPU build) is kept as it is.
# Override the pin with RACE_TORCH_SPEC, e.g. RACE_TORCH_SPEC="torch==2.13.0+cu126".
#
# Everything else installs under constraints/cpu.txt (the versions the tests passed with)
# when the venv's torch is the version those constraints were made with; with another
# torch (one you brought) the constraints are skipped so pip never swaps your torch or its
# dependencies. RACE_CONSTRAINTS=path uses another file, RACE_CONSTRAINTS=none none.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
VPY=.venv/bin/python
$VPY -m pip install -q --upgrade pip
if ! $VPY -c "import torch" 2>/dev/null; then
  echo "[setup] installing ${RACE_TORCH_SPEC:-torch==2.13.0}"
  $VPY -m pip install -q "${RACE_TORCH_SPEC:-torch==2.13.0}"
fi
CONSTRAINTS=${RACE_CONSTRAINTS:-constraints/cpu.txt}
ARGS=()
if [ "$CONSTRAINTS" != "none" ]; then
  want=$(sed -n 's/^# torch-version: *//p' "$CONSTRAINTS")
  have=$($VPY -c "import torch; print(torch.__version__.split('+')[0])")
  if [ -n "${RACE_CONSTRAINTS:-}" ] || [ -z "$want" ] || [ "$want" = "$have" ]; then
    ARGS=(-c "$CONSTRAINTS")
  else
    echo "[setup] torch $have kept; $CONSTRAINTS was made with torch $want: installing without it"
  fi
fi
echo "[setup] installing race-rl[all] (editable${ARGS:+, constraints ${ARGS[1]}})"
$VPY -m pip install -q "${ARGS[@]}" -e ".[all]"
$VPY -c "import race, torch, transformers, peft, trl, ray; print('[setup] ok: torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__, '| trl', trl.__version__, '| ray', ray.__version__)"
