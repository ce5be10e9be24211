#!/usr/bin/env bash
# NVIDIA Dynamo (frontend, router, mocker workers; no GPU) in its own virtual environment, for `make e2e`.
# Cached: a venv whose stamp names the pinned version is reused as it is (shared facts: dynamo-cpu.md).
set -euo pipefail
VENV=${1:?usage: setup_dynamo.sh VENV}
VERSION=1.6.1
STAMP="$VENV/.kvscope-e2e-ai-dynamo-$VERSION"
[ -f "$STAMP" ] && exit 0
echo "e2e: installing ai-dynamo $VERSION into $VENV (ai-dynamo-runtime is a ~75 MB native wheel; with"
echo "     transformers and the rest the venv takes ~0.7 GB; about a minute and a half here)"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# ai-dynamo's own requirements but aisimulate: that one is a stub wheel that fetches the real one from another
# index while installing, which fails offline; the frontend and the mocker start without it. Then ai-dynamo
# itself without its dependencies. The ranges are ai-dynamo 1.6.1's METADATA.
"$VENV/bin/pip" install -q "ai-dynamo-runtime==$VERSION" "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" \
  "kubernetes>=32.0.1,<33.0.0" "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" \
  "redis>=6.2.0,<9.0.0" "tqdm>=4.0.0" "transformers>=4.56.0" "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1.0"
"$VENV/bin/pip" install -q --no-deps "ai-dynamo==$VERSION"
"$VENV/bin/python" -c 'import importlib.metadata as m, dynamo.frontend, dynamo.mocker
print("e2e: ai-dynamo", m.version("ai-dynamo"), "ai-dynamo-runtime", m.version("ai-dynamo-runtime"))'
touch "$STAMP"
