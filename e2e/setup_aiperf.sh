#!/usr/bin/env bash
# AIPerf, the benchmark client, in its own virtual environment for `make e2e` (shared facts: clients.md).
# Cached: a venv whose stamp names the pinned version is reused as it is. The tokenizer AIPerf needs is the
# tiny model's own (e2e/conftest.py lays it out as an HF-cache repo), so nothing else is installed.
set -euo pipefail
VENV=${1:?usage: setup_aiperf.sh VENV}
VERSION=0.13.0
STAMP="$VENV/.kvscope-e2e-aiperf-$VERSION"
[ -f "$STAMP" ] && exit 0
echo "e2e: installing aiperf $VERSION into $VENV (about 1.2 GB on disk, no torch; a minute or two here)"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "aiperf==$VERSION"
"$VENV/bin/aiperf" --version
touch "$STAMP"
