#!/usr/bin/env bash
# Install what benchmarks/gpu_check.py needs on a machine that already has a CUDA torch,
# without replacing that torch (or its triton):
#
#   bash benchmarks/gpu_setup.sh && python benchmarks/gpu_check.py --out $OUT/gpu.json
#
# It pins the torch (and triton) that is installed, then installs RACE with its train, trl
# and report extras (editable), WITHOUT constraints/cpu.txt (made for the CPU torch 2.13.0).
# If the editable install cannot build (no network for build isolation), it installs the
# same third-party packages alone: gpu_check.py imports RACE from this tree's src/ anyway.
#
#   PYTHON=python3.11     the interpreter to install into (default: python, else python3)
#   RACE_WHEELS=/path     install offline from a folder of wheels (pip --no-index --find-links)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3)}
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[gpu_setup] $PY has no torch: install a CUDA build first (https://pytorch.org), this script keeps it" >&2
  exit 2
fi
"$PY" -c "import torch; print('[gpu_setup] torch', torch.__version__, '| CUDA', torch.version.cuda, '| available:', torch.cuda.is_available())"
PIN=$(mktemp)
trap 'rm -f "$PIN"' EXIT
"$PY" - >"$PIN" <<'PYEOF'
import importlib.metadata as md
for dist in ("torch", "triton", "pytorch-triton"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        pass
PYEOF
echo "[gpu_setup] keeping: $(tr '\n' ' ' <"$PIN")"
SRC=()
if [ -n "${RACE_WHEELS:-}" ]; then
  SRC=(--no-index --find-links "$RACE_WHEELS")
  echo "[gpu_setup] offline, from $RACE_WHEELS"
fi
if ! "$PY" -m pip install -q "${SRC[@]}" -c "$PIN" -e ".[train,trl,report]"; then
  echo "[gpu_setup] editable install failed; installing the third-party packages alone (src/ is on gpu_check's path)"
  "$PY" -m pip install -q "${SRC[@]}" -c "$PIN" "transformers>=5.24,<6" "peft>=0.21,<1" "trl>=1.16,<1.17" \
    accelerate "datasets>=3.0" "safetensors>=0.4" "tokenizers>=0.20" "numpy>=1.26" "typer>=0.12" "rich>=13" \
    "pyyaml>=6" "pydantic>=2.6" || exit 1
fi
"$PY" -c "import torch, transformers, peft, trl, accelerate, datasets; print('[gpu_setup] ok: torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__, '| trl', trl.__version__, '| accelerate', accelerate.__version__)"
