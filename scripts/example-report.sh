#!/usr/bin/env bash
# Regenerate the example report committed under docs/example-report/ from a demo study:
#   bash scripts/example-report.sh [STUDY_DIR]   (default studies/demo; runs the demo first when it holds no study)
# The report is written with relative figure paths, the study directory's absolute path replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
study=${1:-studies/demo}
if [ ! -f "$study/study.sqlite" ]; then
  bash scripts/demo.sh --study-dir "$study" --quiet
fi
out=docs/example-report
rm -rf "$out"
.venv/bin/race report "$study" --out "$out" > /dev/null
rm -f "$out"/*.tex "$out"/report_card.json
abs=$(cd "$study" && pwd)
for f in "$out"/*.md "$out"/*.html "$out"/*.json; do
  [ -f "$f" ] && sed -i "s#$abs#studies/demo#g" "$f"
done
du -sh "$out"
