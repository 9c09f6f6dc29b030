#!/usr/bin/env bash
# One lent GPU session (one H100 or H200, 16 cores, no network, 15 minutes of device time in all), prepared here.
#
#   bash benchmarks/gpu_session.sh prepare   # HERE, on the CPU machine: wheels, data, excludes, the device calls
#   bash benchmarks/gpu_session.sh runs      # GPU call 1: the comparison's pending extrapolation runs
#   bash benchmarks/gpu_session.sh bench     # GPU call 2: GPU benchmarks + FSDP2 / DeepSpeed ZeRO-2 launches
#
# prepare (CPU machine; light: downloads and copies)
#   * .whl/: what the GPU image lacks or has too old (it has torch 2.11, accelerate 1.15, transformers 5.17,
#     tokenizers 0.23.2, no datasets, no deepspeed): transformers 5.23.0, tokenizers 0.23.3, datasets 5.2.0 with
#     dill and multiprocess (and fsspec 2026.9.0, datasets' upper bound), sacrebleu 2.6.0 (the version the
#     recorded BLEU signatures name), deepspeed 0.19.8 (pure Python, ops JIT-compiled; built here with
#     `pip wheel`) with hjson, pydantic, pydantic-core, annotated-types, typing-inspection and
#     typing-extensions (pydantic needs >= 4.16).
#   * .carry/data/multi30k: a copy of the shared Multi30k (../shared/data does not travel).
#   * /.whl/ and /.carry/ into .git/info/exclude; checks that what travels stays under 64 MiB; prints the calls.
#
# The device calls (a command line is at most 2000 characters; carry names ignored paths):
#   1. run  command="bash benchmarks/gpu_session.sh runs"  carry=[".whl", ".carry"]  timeout_s=540
#      Sized for RUNS_BUDGET = 480 s: the wheels installed (~10 s), then compare.py --tables extrapolation
#      --seeds 1 2 with JOBS = 12 runs at once, 1 thread each, --stop_after_minutes 1 so that only the first
#      wave starts (a wave of 10-12 runs of this d256 recipe took 340-372 s on an H100, measurements included; a
#      run cut off on the GPU is lost, it resumes only on the machine that holds its checkpoints), under an
#      outer timeout at RUNS_BUDGET - 20 s from the script's start; then the new result files and every run's
#      train log are packed into $OUT.
#   2. run  command="BENCH_BUDGET=270 bash benchmarks/gpu_session.sh bench"  carry=[".whl", ".carry"]
#      timeout_s=BENCH_BUDGET + 40, AT ONCE after call 1 returns (the machine stays warm for 30 s; a cold start
#      costs 1-2 minutes and reinstalls the wheels). BENCH_BUDGET: call 1's lease.budget_left_s less 45 s, at
#      most 300. Every piece runs under its own `timeout`, capped by what is left of BENCH_BUDGET, in this order:
#      (a) base training step of every module vs stock Marian (bf16, 16k-token batches, L = 128 and 512; ~70 s,
#      cap 120); (b) big (d1024, 16 heads, FFN 4096) sinusoidal vs stock Marian (~35 s, cap 60); (c) train.py
#      through accelerate on the one GPU with fsdp.yaml (FSDP2) and deepspeed_zero2.yaml side by side, each a
#      fresh run of 10 updates with checkpoints, then that run resumed to 20 updates (~80 s, cap 110); (d) last,
#      sinusoidal vs stock Marian at base under torch.compile (L = 512), with what is left (cap 150; it needs
#      ~100 s for two compilations, so it is the piece a short budget drops).
#   3. give_back.
#   Budget: a 1-2 minute start + ~480 s + ~270 s + transfers is 14-15 minutes, the whole of a session's device
#   time: check `status` first, and with less left lower RUNS_BUDGET and JOBS together (`JOBS=10
#   RUNS_BUDGET=430 bash benchmarks/gpu_session.sh runs`) and BENCH_BUDGET.
#
# Environment (all optional): JOBS (12), SEEDS ("1 2"), SYSTEMS (only these systems, e.g. to leave out runs that
# a CPU job is training), STOP_MINUTES (1), RUNS_BUDGET (480), BENCH_BUDGET (270), TOKENS (bench batch, 16384),
# SHARED_DATA (/work/shared/data: where the GPU phases copy the carried data, so that scores.json names the same
# test-set path as the CPU machine's runs; never overwritten), DRY_RUN=1 (print the GPU phases' commands instead
# of running them: no install, no Python, nothing written outside /tmp).
#
# What comes back ($OUT on the device, at most 8 files):
#   runs:  runs.log; runs-results.tgz (the new or changed files under results/, paths from the repo root: untar
#          it there); runs-train-logs.tgz (<recipe>/<pair>/<system>/seed<N>.train.log); results.md (the report
#          compare.py wrote from the GPU copy's results/; rebuild it here with --report_only)
#   bench: bench.log; bench-docs.tgz (base/, big/, compile/: benchmarks-<size>.{md,json,png} as written, fresh
#          pages without the CPU pages' notes); smoke.tgz (launch logs, scores.json, trainer_state.json,
#          run_settings.json; no weights); benchmarks-base.md, benchmarks-big.md, benchmarks-base-compile.md
#          (copies to read at once)

set -uo pipefail

PHASE=${1:-}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF=$REPO/benchmarks/$(basename "${BASH_SOURCE[0]}")
cd "$REPO" || exit 1

WHEELS=(
    transformers==5.23.0
    tokenizers==0.23.3
    datasets==5.2.0
    dill==0.4.1
    multiprocess==0.70.19
    fsspec==2026.9.0
    sacrebleu==2.6.0
    hjson==3.1.0
    pydantic==2.14.4
    pydantic-core==2.50.5
    annotated-types==0.8.0
    typing-inspection==0.4.5
    typing-extensions==4.16.0
)
DEEPSPEED=deepspeed==0.19.8  # an sdist only on PyPI: built into a wheel here
DATA_SOURCE=${HF_POSENC_DATA:-$REPO/../shared/data}
SHARED_DATA=${SHARED_DATA:-/work/shared/data} # where the GPU phases put the carried data (its path on this machine)
OUT=${OUT:-/tmp/gpu_session_out}
WORK=/tmp/gpu_session
JOBS=${JOBS:-12}
SEEDS=${SEEDS:-1 2}
SYSTEMS=${SYSTEMS:-}
STOP_MINUTES=${STOP_MINUTES:-1}
RUNS_BUDGET=${RUNS_BUDGET:-480}
BENCH_BUDGET=${BENCH_BUDGET:-270}
TOKENS=${TOKENS:-16384}
DRY_RUN=${DRY_RUN:-}

log() { printf '[gpu_session %4ds] %s\n' "$SECONDS" "$*"; }

# x CMD...: run it, or under DRY_RUN=1 print it
x() {
    if [[ -n $DRY_RUN ]]; then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
        return 0
    fi
    "$@"
}

mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

# ---------------------------------------------------------------------------------------------------------------
prepare() {
    local py=${PYTHON:-python3}
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
    log "wheels for the GPU image (CPython 3.12, x86-64) into .whl/"
    rm -rf .whl && mkdir -p .whl || return 1
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .whl "${WHEELS[@]}" || { log "pip download failed"; return 1; }
    # No ops prebuilt (DS_BUILD_OPS=0): DeepSpeed JIT-compiles an op when one is used (ZeRO-2 with the
    # Trainer's torch AdamW uses none)
    DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps -w .whl "$DEEPSPEED" || { log "deepspeed wheel failed"; return 1; }
    local names
    names=$(for f in .whl/*.whl; do basename "$f" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'; done | sort)
    if [[ -n $(uniq -d <<<"$names") ]]; then
        log "two versions of one package in .whl: $(uniq -d <<<"$names" | tr '\n' ' ')"
        return 1
    fi

    log "Multi30k from $DATA_SOURCE/multi30k into .carry/data/multi30k"
    [[ -d $DATA_SOURCE/multi30k ]] || { log "no $DATA_SOURCE/multi30k (set HF_POSENC_DATA)"; return 1; }
    rm -rf .carry/data && mkdir -p .carry/data && cp -rp "$DATA_SOURCE/multi30k" .carry/data/ || return 1

    local exclude
    exclude=$(git rev-parse --git-path info/exclude) || return 1
    mkdir -p "$(dirname "$exclude")" && touch "$exclude"
    for pattern in /.whl/ /.carry/; do
        grep -qxF "$pattern" "$exclude" || echo "$pattern" >>"$exclude"
    done
    if ! git check-ignore -q .whl/x || ! git check-ignore -q .carry/x; then
        log ".whl or .carry is not ignored by git"
        return 1
    fi

    # what travels: tracked and untracked-not-ignored files, plus the carried folders (64 MiB in all)
    local tree carried total
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
        awk '{s += $1} END {print s + 0}')
    carried=$(du -sb .whl .carry | awk '{s += $1} END {print s}')
    total=$((tree + carried))
    printf '\n.whl: %s MiB\n' "$(mib "$(du -sb .whl | cut -f1)")"
    for f in .whl/*.whl; do printf '  %9d  %s\n' "$(stat -c %s "$f")" "$(basename "$f")"; done
    printf '.carry: %s MiB (%s)\n' "$(mib "$(du -sb .carry | cut -f1)")" "$(cd .carry/data/multi30k && echo *)"
    printf 'travels: tree %s MiB + carried %s MiB = %s MiB of 64\n' "$(mib "$tree")" "$(mib "$carried")" \
        "$(mib "$total")"
    if ((total > 60 * 1048576)); then
        log "over 60 MiB: too close to the 64 MiB limit"
        return 1
    fi

    cat <<'EOF'

Device calls (check `status` first: about 14-15 minutes of device time are needed):
  1. run   command: bash benchmarks/gpu_session.sh runs
           carry:   [".whl", ".carry"]   timeout_s: 540
  2. run   command: BENCH_BUDGET=270 bash benchmarks/gpu_session.sh bench
           carry:   [".whl", ".carry"]   timeout_s: 310
           at once after call 1 (the machine is warm for 30 s); BENCH_BUDGET = call 1's lease.budget_left_s
           less 45, at most 300; timeout_s = BENCH_BUDGET + 40
  3. give_back
Then, here: tar -xzf <files_at>/runs-results.tgz -C <repo root>   (its paths start with results/)
EOF
}

# ---------------------------------------------------------------------------------------------------------------
# On the GPU machine: the wheels into /tmp/site (kept between calls on a warm machine), offline settings, data.
setup_gpu() {
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    export HF_HUB_DISABLE_TELEMETRY=1 MPLBACKEND=Agg DS_ACCELERATOR=cuda
    export HF_POSENC_CACHE=$WORK/cache
    mkdir -p "$WORK" "$OUT"
    local stamp=/tmp/site/.gpu_session_wheels
    if [[ -n $DRY_RUN ]]; then
        x python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl
    elif [[ -f $stamp ]] && [[ $(cat "$stamp") == "$(ls .whl)" ]]; then
        log "wheels already installed in /tmp/site (warm machine)"
    else
        local wheels=(.whl/*.whl)
        log "installing ${#wheels[@]} wheels into /tmp/site"
        rm -rf /tmp/site
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || { log "wheel install failed (was .whl carried?)"; return 1; }
        ls .whl >"$stamp"
    fi
    export PYTHONPATH=$REPO:/tmp/site
    if [[ ! -d .carry/data/multi30k ]]; then
        log "no .carry/data/multi30k: run prepare on the CPU machine and carry .carry"
        return 1
    fi
    # The data where the CPU machine has it, so that scores.json records the same test-set path as every other
    # run; else read from the carried copy
    if [[ -d $SHARED_DATA/multi30k ]]; then
        export HF_POSENC_DATA=$SHARED_DATA # copied by an earlier call on this machine: never overwritten
    elif [[ -n $DRY_RUN ]]; then
        export HF_POSENC_DATA=$SHARED_DATA
        x cp -rp .carry/data/multi30k "$SHARED_DATA/"
    elif mkdir -p "$SHARED_DATA" 2>/dev/null && cp -rp .carry/data/multi30k "$SHARED_DATA/" 2>/dev/null; then
        export HF_POSENC_DATA=$SHARED_DATA
    else
        export HF_POSENC_DATA=$REPO/.carry/data
    fi
    log "repo $REPO, HF_POSENC_DATA=$HF_POSENC_DATA, OUT=$OUT"
    [[ -n $DRY_RUN ]] && return 0
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    # The versions as imported (the wheels in /tmp/site shadow the image's) and the imports the phase needs
    python3 - "$PHASE" <<'PY'
import importlib.metadata as md
import sys


def version(name):
    try:
        return md.version(name)  # the first distribution on sys.path: /tmp/site's before the image's
    except md.PackageNotFoundError:
        return None


names = ["torch", "transformers", "tokenizers", "datasets", "accelerate", "sacrebleu", "huggingface_hub",
         "safetensors", "pyarrow", "fsspec", "dill", "multiprocess", "numpy", "regex", "deepspeed", "pydantic"]
print("versions: " + ", ".join(f"{name} {version(name) or 'MISSING'}" for name in names), flush=True)
import torch
import transformers
from packaging.version import Version

import datasets  # noqa: F401  (the corpus cache needs it)

print(f"cuda {torch.version.cuda}, {torch.cuda.get_device_name()}; transformers from {transformers.__file__}")
if not Version("5.23") <= Version(transformers.__version__) < Version("5.25"):
    sys.exit(f"transformers {transformers.__version__} is not >=5.23,<5.25: the wheels did not take")
if version("pyarrow") and Version(version("pyarrow")) < Version("24"):
    print(f"WARNING: pyarrow {version('pyarrow')} is older than datasets 5.2 asks (>=24)")
if sys.argv[1] == "bench":
    import deepspeed

    print(f"deepspeed {deepspeed.__version__} imports")
PY
}

# ---------------------------------------------------------------------------------------------------------------
runs() {
    setup_gpu || return 1
    local marker=$WORK/runs.marker models=$WORK/models
    touch "$marker"
    sleep 1 # mtime granularity: every file written from here on is newer than the marker
    local limit=$((RUNS_BUDGET - SECONDS - 20))
    log "compare.py: $JOBS runs at once, none started after $STOP_MINUTES min, stopped after $limit s"
    # shellcheck disable=SC2086  # SEEDS and SYSTEMS are word lists
    x timeout --kill-after=15 "$limit" python3 python -m study --tables extrapolation --seeds $SEEDS \
        --jobs "$JOBS" --threads 1 --stop_after_minutes "$STOP_MINUTES" --results_dir "$REPO/results" \
        --models_dir "$models" --report "$WORK/results.md" ${SYSTEMS:+--systems $SYSTEMS}
    local status=$?
    ((status == 124)) && log "compare.py was stopped by the timeout: runs unfinished then are lost"
    log "compare.py exit status $status; packing"
    x pack_runs "$marker" "$models"
    return "$status"
}

pack_runs() {
    local marker=$1 models=$2
    find results -type f -newer "$marker" | sort >"$WORK/changed.txt"
    log "$(grep -c '/settings.json$' "$WORK/changed.txt") finished runs, $(wc -l <"$WORK/changed.txt") files:"
    grep '/settings.json$' "$WORK/changed.txt" | sed 's|/settings.json$||; s|^|  |'
    [[ -s $WORK/changed.txt ]] && tar -czf "$OUT/runs-results.tgz" -T "$WORK/changed.txt"
    if [[ -d $models ]]; then
        (cd "$models" && find . -name '*.train.log' | sort) >"$WORK/logs.txt"
        [[ -s $WORK/logs.txt ]] && tar -czf "$OUT/runs-train-logs.tgz" -C "$models" -T "$WORK/logs.txt"
    fi
    [[ -f $WORK/results.md ]] && cp "$WORK/results.md" "$OUT/results.md"
    ls -l "$OUT"
}

# ---------------------------------------------------------------------------------------------------------------
# piece NAME CAP CMD...: CMD under `timeout`, for at most CAP s and never past BENCH_BUDGET (less 15 s to pack);
# its output into $WORK/logs/NAME.log, the end of it into the phase log.
piece() {
    local name=$1 cap=$2
    shift 2
    local left=$((BENCH_BUDGET - SECONDS - 15))
    local limit=$((cap < left ? cap : left))
    if ((limit < 20)); then
        log "$name: SKIPPED, $left s of the budget left"
        echo "$name (skipped)" >>"$WORK/failed"
        return 1
    fi
    log "$name: up to $limit s"
    if [[ -n $DRY_RUN ]]; then
        x timeout --kill-after=10 "$limit" "$@"
        return 0
    fi
    local start=$SECONDS status
    timeout --kill-after=10 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
    status=$?
    tail -n 25 "$WORK/logs/$name.log" | sed "s|^|[$name] |"
    log "$name: exit status $status after $((SECONDS - start)) s$( ((status == 124)) && echo ' (TIMED OUT)')"
    ((status == 0)) || echo "$name (exit $status)" >>"$WORK/failed"
    return "$status"
}

bench() {
    setup_gpu || return 1
    rm -rf "$WORK/logs" "$WORK/bench" "$WORK/failed"
    mkdir -p "$WORK/logs" "$WORK/bench"
    local gpu="" peak=() systems=""
    [[ -z $DRY_RUN ]] && gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case $gpu in # dense bf16 datasheet peaks: the MFU denominator on a GPU (benchmarks/report.py)
        *H100*PCIe*) peak=(--peak_tflops 756) ;;
        *H100* | *H200*) peak=(--peak_tflops 989) ;;
    esac
    [[ -z $DRY_RUN ]] && systems=$(python3 -c 'from hf_posenc.pipeline.systems import main_systems
print(" ".join(s.name for s in main_systems()))' 2>/dev/null)
    [[ -z $systems ]] && systems="none sinusoidal learned rpe_head mpr_head posnet_embed posnet_attn shaw t5_bias \
adaptive_t5 alibi rope fire kerple relative_attention aposnet rposnet fourier gaussian linear glinear lightconv"
    local common=(--device cuda --phases training --threads 8 --tokens_per_batch "$TOKENS" --repeats 3 "${peak[@]}")

    # (a) base: every module (the main table's systems) against stock Marian
    # shellcheck disable=SC2086  # the system list
    piece base 120 python3 -m benchmarks.run --config base --lengths 128 512 "${common[@]}" --systems $systems \
        --output_dir "$WORK/bench/base"
    # (b) big: sinusoidal against stock Marian
    piece big 60 python3 -m benchmarks.run --config big --lengths 128 512 "${common[@]}" --systems sinusoidal \
        --output_dir "$WORK/bench/big"
    # (c) FSDP2 and DeepSpeed ZeRO-2 through accelerate on the one GPU, side by side (their own ports)
    piece smoke-fsdp 110 bash "$SELF" _smoke fsdp train_scripts/accelerate/fsdp.yaml 29511 &
    local fsdp=$!
    piece smoke-deepspeed 110 bash "$SELF" _smoke deepspeed train_scripts/accelerate/deepspeed_zero2.yaml 29512 &
    local deepspeed=$!
    wait "$fsdp"
    wait "$deepspeed"
    x smoke_summary
    # (d) torch.compile: sinusoidal and stock Marian at base, one length, with what is left
    piece compile 150 python3 -m benchmarks.run --config base --lengths 512 "${common[@]}" --systems sinusoidal \
        --compile --output_dir "$WORK/bench/compile"
    x pack_bench
    if [[ -s $WORK/failed ]]; then
        log "pieces not done: $(paste -sd, "$WORK/failed")"
        return 1
    fi
    log "every piece finished"
}

# One sharded launch on the one GPU: a fresh run of 10 updates (checkpoints at 5 and 10, both averaged), then
# the same run resumed from its last checkpoint to 20 updates. The tiny recipe (d128, 2+2 layers), 2,000 pairs.
smoke() {
    local name=$1 config=$2 port=$3
    local output=$WORK/smoke/$name
    local launch=(python3 -m accelerate.commands.launch --config_file "$config" --num_processes 1
        --main_process_port "$port")
    local flags=(train_scripts/train.py --recipe multi30k-en-de-tiny --train_limit 2000 --vocab_size 1000
        --test_limit 16 --minutes 0 --save_strategy steps --save_steps 5 --average_last 2 --logging_steps 1
        --precision bf16 --attention_backend sdpa --examples 0 --fail_on_degenerate false --disable_tqdm true
        --output_dir "$output")
    x rm -rf "$output" "$output-checkpoints"
    x mkdir -p "$(dirname "$output")"
    echo "=== $name: fresh launch, 10 updates"
    x "${launch[@]}" "${flags[@]}" --max_steps 10 --overwrite_output_dir || return $?
    echo "=== $name: the same run resumed, to 20 updates"
    x "${launch[@]}" "${flags[@]}" --max_steps 20 --resume_from_checkpoint last || return $?
    echo "=== $name: both launches finished"
}

smoke_summary() {
    local name
    for name in fsdp deepspeed; do
        python3 - "$WORK/smoke/$name" <<'PY'
import json
import sys
from pathlib import Path

output = Path(sys.argv[1])
scores = output / "scores.json"
if not scores.is_file():
    sys.exit(print(f"smoke {output.name}: no scores.json (see logs/smoke-{output.name}.log)"))
s = json.loads(scores.read_text())
keys = ("steps", "resumed_from", "updates_this_attempt", "bleu", "precision", "averaged_checkpoints")
print(f"smoke {output.name}: " + ", ".join(f"{key}={s.get(key)}" for key in keys))
PY
    done
}

pack_bench() {
    (cd "$WORK/bench" && tar -czf "$OUT/bench-docs.tgz" .)
    [[ -f $WORK/bench/base/benchmarks-base.md ]] && cp "$WORK/bench/base/benchmarks-base.md" "$OUT/"
    [[ -f $WORK/bench/big/benchmarks-big.md ]] && cp "$WORK/bench/big/benchmarks-big.md" "$OUT/"
    [[ -f $WORK/bench/compile/benchmarks-base.md ]] &&
        cp "$WORK/bench/compile/benchmarks-base.md" "$OUT/benchmarks-base-compile.md"
    (cd "$WORK" && find logs smoke -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) \
        ! -path '*global_step*' 2>/dev/null | sort >smoke.txt && tar -czf "$OUT/smoke.tgz" -T smoke.txt)
    ls -l "$OUT"
}

# ---------------------------------------------------------------------------------------------------------------
case $PHASE in
    prepare)
        prepare
        ;;
    runs | bench)
        mkdir -p "$OUT"
        budget=$([[ $PHASE == runs ]] && echo "$RUNS_BUDGET" || echo "$BENCH_BUDGET")
        log "phase $PHASE on $(hostname), sized for $budget s" | tee -a "$OUT/$PHASE.log"
        "$PHASE" 2>&1 | tee -a "$OUT/$PHASE.log"
        status=${PIPESTATUS[0]}
        log "phase $PHASE done: exit status $status after $SECONDS s" | tee -a "$OUT/$PHASE.log"
        exit "$status"
        ;;
    _smoke) # internal: one of bench's sharded launches
        shift
        smoke "$@"
        ;;
    *)
        sed -n '2,/^$/p' "$SELF"
        exit 2
        ;;
esac
