#!/usr/bin/env bash
# The GPU check, in one command, from a clean copy of the repo on a machine with a CUDA GPU, torch
# and triton, and no network. Run bench/fetch_gpu_wheels.sh first where pip reaches an index: it
# puts this project's wheel and the dependencies such a machine lacks into wheels/, which this
# script installs with `pip --no-index --target` into a throwaway folder on PYTHONPATH, beside the
# machine's own torch (a venv made from the image's venv would see the base Python's packages, not
# the torch installed in that venv).
#
#   bench/gpu_check.sh            (PYTHON=... for another interpreter; COLDSTART_REPEAT=1 by default)
#
# Prints one PASS/FAIL line per check, then the cold-start table; exits non-zero if any check failed.
# Budget: under 8 minutes on one GPU; the cold-start bench gets whatever the other checks leave.
# The logs stay in $TMPDIR/precompile-gpu-check-logs (GPU_CHECK_LOGS=... for another folder).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
python=${PYTHON:-python3}
site=${TMPDIR:-/tmp}/precompile-gpu-check-site
logs=${GPU_CHECK_LOGS:-${TMPDIR:-/tmp}/precompile-gpu-check-logs}
rm -rf "$site" "$logs"
mkdir -p "$logs"
budget=${GPU_CHECK_BUDGET_S:-450}
failed=0
results=()

within() {  # seconds this step may take: at most $1, and never past the budget
    local left=$((budget - SECONDS))
    if ((left < 10)); then left=10; fi
    echo $(($1 < left ? $1 : left))
}

report() {  # name, status, detail
    results+=("$2 $1: $3")
    echo "$2 $1: $3"
    if [[ $2 == FAIL ]]; then failed=1; fi
}

install() {
    if ! compgen -G "wheels/precompile-*.whl" >/dev/null; then
        echo "wheels/ holds no precompile wheel: run bench/fetch_gpu_wheels.sh where pip reaches an index" >&2
        return 1
    fi
    # Exactly the carried wheels (--no-deps): the image brings torch, triton, pytest and hypothesis.
    "$python" -m pip install --quiet --isolated --no-index --no-deps --no-compile --target "$site" wheels/*.whl &&
        "$python" -c "import torch, triton, precompile; assert torch.cuda.is_available(), 'no CUDA device'"
}

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$site/bin:$PATH"
if install >"$logs/install.log" 2>&1; then
    report install PASS "$("$python" -c 'import torch, triton; print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")')"
else
    report install FAIL "$(grep -m 1 -E "ERROR|Error" "$logs/install.log" || tail -n 1 "$logs/install.log") (log: $logs/install.log)"
    exit 1
fi
py=$python

# The CUDA tests and the Triton ones (which run on any machine with triton, a GPU one included).
# Only the files that carry those marks: the rest of tests/ needs the test extra's servers and scanners.
mapfile -t marked < <(grep -rlE "pytest\.mark\.(cuda|triton)" tests)
if timeout "$(within 180)" "$py" -m pytest -q -p no:cacheprovider -m "cuda or triton" "${marked[@]}" >"$logs/pytest.log" 2>&1; then
    report cuda-tests PASS "$(tail -n 1 "$logs/pytest.log")"
else
    report cuda-tests FAIL "$(tail -n 1 "$logs/pytest.log") (log: $logs/pytest.log)"
fi

if line=$(timeout "$(within 150)" "$py" bench/gpu_e2e.py 2>"$logs/e2e.log"); then
    report e2e-triton PASS "${line#PASS e2e-triton: }"
else
    report e2e-triton FAIL "${line#FAIL e2e-triton: } (log: $logs/e2e.log)"
fi

# The rank check over NCCL: torchrun, capture with a collective, load_everywhere on every rank (one
# rank per GPU, at most 2; a one-GPU machine checks a world of size 1).
if line=$(timeout "$(within 240)" "$py" bench/gpu_ranks.py --backend nccl 2>"$logs/ranks.log"); then
    report ranks-nccl PASS "${line#PASS ranks-nccl: }"
else
    report ranks-nccl FAIL "${line#FAIL ranks-nccl: } (log: $logs/ranks.log)"
fi

if timeout "$(within 450)" "$py" bench/coldstart.py --device cuda --repeat "${COLDSTART_REPEAT:-1}" --models mlp \
    >"$logs/coldstart.txt" 2>"$logs/coldstart.log"; then
    report coldstart PASS "bench/coldstart.py --device cuda"
else
    report coldstart FAIL "exit $? (log: $logs/coldstart.log)"
fi

echo
echo "== summary =="
printf '%s\n' "${results[@]}"
echo
echo "== cold start (bench/coldstart.py --device cuda --models mlp) =="
cat "$logs/coldstart.txt"
exit "$failed"
