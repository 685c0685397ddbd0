#!/usr/bin/env bash
# Download what bench/gpu_check.sh installs on a GPU machine that has torch and triton but no network:
# this project's wheel and the dependencies that machine lacks, for its Python (3.12 by default,
# PY_VERSION=3.11 etc. for another), into wheels/ (ignored by git). Run it where pip reaches an index:
#   bench/fetch_gpu_wheels.sh && bench/gpu_check.sh     (the second on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
py_version=${PY_VERSION:-3.12}
python=${PYTHON:-python3}
out=wheels
rm -rf "$out"
mkdir -p "$out"
# Pure-Python ones and the two compiled ones the GPU image lacks; --no-deps keeps exactly these
# (jinja2's markupsafe and rich's markdown-it-py, mdurl and pygments ship with that image, but
# carrying them costs little and keeps the check independent of the image's list).
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py_version" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$out" \
    "msgspec>=0.18" "zstandard>=0.22" "jinja2>=3.1" "markupsafe>=2.0" "rich>=13" "markdown-it-py>=2.2" "mdurl~=0.1" \
    "pygments>=2.13" "syrupy==7.0.2"
"$python" -m pip wheel --quiet --no-deps -w "$out" .
ls -1 "$out"
du -sh "$out"
