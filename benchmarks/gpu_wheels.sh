#!/usr/bin/env bash
# Add to .gpu-wheels/ the wheels that `pytest -m gpu tests/gpu` needs on the GPU machine beyond what
# `bash ../shared/gpu/prepare.sh` put there (transformers, huggingface_hub and their needs). Run it from the
# project's root after prepare.sh:
#     bash ../shared/gpu/prepare.sh && bash benchmarks/gpu_wheels.sh
# then, on the GPU machine (which reaches no registry), from the project's root:
#     source .gpu-wheels/env.sh && python3 -m pytest -m gpu tests/gpu -q
# (`tests/gpu`, not `tests`: collecting the whole suite imports modules that need packages the image lacks).
#
# Versions are those of our .venv; wheels are for CPython 3.12 on x86_64 (the GPU image's), pure Python or
# manylinux, fetched with `pip download --no-deps --only-binary=:all:` as prepare.sh does. Groups:
#   test:     pytest and its needs (the image may have no pytest), pyyaml (tests/helpers.py imports it),
#             tokenizers and safetensors (transformers checks their versions when imported)
#   recipes:  accelerate, peft and their needs (the Trainer runs of tests/gpu/test_cuda_recipes.py); pillow
#             (tests/recipes/test_classification.py, whose tiny assets the classification run reuses, imports it)
#   metrics:  evaluate, nltk, absl-py and their small needs, and rouge-score (published as a source archive
#             only: built here into a pure-Python wheel): `hf_gate_attention.recipes` refuses to import
#             without them (the first GPU run's recipe checks failed on that)
#   datasets: datasets and its small needs (dill, multiprocess, xxhash, fsspec, requests, ...): the
#             summarization, classification and distillation recipes import it
#   arrow:    pyarrow, pandas and numpy, which datasets needs too (~80 MiB with pyarrow's 53): added only while
#             .gpu-wheels/ stays under GPU_WHEELS_MAX_MIB (default 55; the GPU run carries at most 64 MiB).
#             Without them, datasets imports only if the image has pyarrow >= 24 and pandas; else those
#             three tests skip.
# It also makes env.sh install into a folder named site-packages (/tmp/gpu/site-packages instead of
# /tmp/site): dill, which datasets fingerprints with, pickles modules *by value* unless their file path has
# "site-packages" in it (or the interpreter's prefix), and dies on pyarrow's MonthDayNano when pyarrow comes
# from such a folder (reproduced with these wheels on CPython 3.12: `Dataset.from_dict` fails).
# Prints what it added, the sizes, and what it left out.
set -euo pipefail
shopt -s nullglob
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
MAX_MIB=${GPU_WHEELS_MAX_MIB:-55}
[ -x "$PY" ] || { echo "no .venv: run 'make install' first" >&2; exit 2; }
[ -f .gpu-wheels/env.sh ] || { echo "no .gpu-wheels/env.sh: run 'bash ../shared/gpu/prepare.sh' first" >&2; exit 2; }

test_pkgs=(pytest pluggy iniconfig packaging pygments pyyaml tokenizers safetensors)
recipe_pkgs=(accelerate psutil peft tqdm pillow)
datasets_pkgs=(datasets dill multiprocess xxhash fsspec filelock requests charset_normalizer idna urllib3 certifi
  python-dateutil six)
arrow_pkgs=(pyarrow pandas numpy)
metric_pkgs=(evaluate nltk absl-py joblib click regex)

# "name==version" of each package our .venv has (skipped with a note when it has none)
specs_of() {
  local p v
  for p in "$@"; do
    if v=$("$PY" -c "import importlib.metadata as m; print(m.version('$p'))" 2>/dev/null); then
      echo "$p==$v"
    else
      echo "note: .venv has no $p, not added" >&2
    fi
  done
}

download() {  # download DIR SPEC...: the wheels of SPEC (no dependencies) into DIR
  local dir=$1
  shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@" 2>&1 | grep -v "^WARNING: Location" || true
}

mib() { du -sm "$1" | cut -f1; }

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
before=$(ls .gpu-wheels)

mapfile -t specs < <(specs_of "${test_pkgs[@]}" "${recipe_pkgs[@]}" "${datasets_pkgs[@]}" "${metric_pkgs[@]}")
download .gpu-wheels "${specs[@]}"
"$PY" -m pip wheel -q --no-deps -w .gpu-wheels "$(specs_of rouge-score)" 2>&1 | grep -v "^WARNING: Location" || true

mapfile -t specs < <(specs_of "${arrow_pkgs[@]}")
download "$staging" "${specs[@]}"
have=$(du -sb .gpu-wheels | cut -f1)
extra=0
for wheel in "$staging"/*.whl; do  # wheels prepare.sh or the groups above already brought are not counted
  [ -e ".gpu-wheels/$(basename "$wheel")" ] || extra=$((extra + $(stat -c %s "$wheel")))
done
if [ $(((have + extra) / 1048576)) -lt "$MAX_MIB" ]; then
  cp -n "$staging"/*.whl .gpu-wheels/
  echo "arrow group (pyarrow, pandas, numpy) added"
else
  echo "LEFT OUT (over ${MAX_MIB} MiB with them: $(((have + extra) / 1048576)) MiB): pyarrow, pandas, numpy;" \
    "datasets then imports only if the image has pyarrow >= 24 and pandas. Their wheels:"
  (cd "$staging" && ls -s --block-size=K -1 ./*.whl | sed 's|\./||')
fi

sed -i -e 's|/tmp/site |/tmp/gpu/site-packages |g' -e 's|/tmp/site:|/tmp/gpu/site-packages:|g' .gpu-wheels/env.sh
# Hugging Face's `kernels` (from prepare.sh) is optional for transformers; with it, Trainer runs of a Llama on
# the GPU kernelized the model on `model.train()` and failed offline ("Version 2 of 'kernels-community/rotary'
# is not available in the local cache", the third GPU run's summarization and distillation checks)
rm -f .gpu-wheels/kernels-*.whl

echo "added to .gpu-wheels/ (KiB):"
for wheel in .gpu-wheels/*.whl; do
  grep -qxF "$(basename "$wheel")" <<<"$before" || echo "  $(du -k "$wheel" | cut -f1)  $(basename "$wheel")"
done
echo "total: $(mib .gpu-wheels) MiB in .gpu-wheels/ ($(ls .gpu-wheels/*.whl | wc -l) wheels)"
