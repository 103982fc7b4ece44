#!/usr/bin/env bash
# One stage of the GPU runbook on the device machine (see gpu_runbook.py's docstring):
#
#     bash drivers/training/gpu_runbook.sh call1|call2
#
# run from the repository root. The machine has torch and triton but not the
# packages the language server needs, and no network: carried wheels
# (.carry/whl) are installed into the work folder when they are missing, and
# the checkout is made importable as `dlm` without pip (a namespace folder of
# links to lsp/, coder_model/, kernels/ and drivers/, as the package-dir mapping does).
# Environment: OUT (results folder, set by the device tool), DLM_GPU_WORK (work
# folder, default /tmp/dlm-gpu: outside the checkout, it outlives the call while
# the machine stays warm), DLM_PYTHON (default python3), DLM_RUNBOOK_CARRY (default .carry).
set -u
stage=${1:?usage: bash drivers/training/gpu_runbook.sh call1|call2}
shift
root=$(pwd)
if [ ! -f "$root/drivers/training/gpu_runbook.py" ]; then
    echo "gpu_runbook.sh: run it from the repository root (no drivers/training/gpu_runbook.py in $root)" >&2
    exit 2
fi
work=${DLM_GPU_WORK:-/tmp/dlm-gpu}
py=${DLM_PYTHON:-python3}
carry=${DLM_RUNBOOK_CARRY:-.carry}
mkdir -p "$work/py/dlm"
if ! "$py" -c "import pygls, lsprotocol, tree_sitter, tree_sitter_python, pytest_lsp, pytest_asyncio" 2>/dev/null; then
    if ls "$carry"/whl/*.whl >/dev/null 2>&1; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$work/site" "$carry"/whl/*.whl \
            || echo "gpu_runbook.sh: installing the carried wheels failed; the LSP tests and benches will fail" >&2
    else
        echo "gpu_runbook.sh: pygls/tree-sitter/pytest-lsp missing and no wheels in $carry/whl (prepare without --no-wheels)" >&2
    fi
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
for pkg in lsp coder_model kernels drivers; do
    ln -sfn "$root/$pkg" "$work/py/dlm/$pkg"
done
export PYTHONPATH="$work/py${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 DLM_GPU_WORK="$work"
exec "$py" -m dlm.drivers.training.gpu_runbook "$stage" "$@"
