#!/usr/bin/env bash
# The GPU figures of docs/benchmarks-gpu/ and docs/decoding.md on a GPU machine, each step under a time limit of
# its own so that a failing step costs only its own figures, in this order (their limits add up to 13 minutes, more
# than one call of a 15-minute lease: STEPS picks; what finished before the call's end is in OUTDIR.tar):
#   training       every main system's training step (bf16), lengths 128 and 512
#   base           the same at base size, length 1024
#   decode         per-token decoding time by prefix (10 to 400), every main system
#   compile        base size, eager against torch.compile
#   decode-model   the make-train model (MODEL) on the Multi30k test set: generate against the fast loop, beam 4
#   generation     every main system and length option, random weights, real lengths: generate against the fast
#                  loop, beam 4 and greedy, token identity
# Usage: benchmarks/gpu.sh OUTDIR   (OUTDIR/<step>.log and OUTDIR/<step>/; OUTDIR.tar holds them all);
# STEPS="generation decode" runs only those. Wheels under .whl/ (a newer transformers than the machine's) are
# installed into /tmp/site first; HF_POSENC_DATA must hold multi30k/test_2016_flickr.{en,de}.gz.
set -u
out=${1:?usage: benchmarks/gpu.sh OUTDIR}
model=${MODEL:-outputs/multi30k-en-de-small-sinusoidal}
steps=${STEPS:-training base decode compile decode-model generation}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD

step() {  # step NAME SECONDS COMMAND...: run under `timeout`, log to OUTDIR/NAME.log, pack everything so far
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    [[ " $steps " == *" $name "* ]] || return 0
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s"
    tail -n 4 "$out/$name.log"
    tar -C "$out" -cf "$out.tar" .
}

bench=(python3 -m benchmarks.run --device cuda --threads 1)
main=(none sinusoidal learned rpe_head mpr_head posnet_embed posnet_attn shaw t5_bias adaptive_t5 alibi rope fire
    kerple relative_attention aposnet rposnet fourier gaussian linear glinear lightconv)
length_options=(learned-randomized kerple-randomized-spread attention-log-length attention-sentences
    attention-windows rope-yarn-scaling)

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# the training steps first: they show what changes in the modules do on the GPU (measured: docs/benchmarks-gpu/)
step training 150 "${bench[@]}" --phases training --lengths 128 512 --repeats 3 --systems "${main[@]}" \
    --output_dir "$out/training"
step base 130 "${bench[@]}" --config base --phases training --lengths 1024 --repeats 3 --systems "${main[@]}" \
    --output_dir "$out/base"
step decode 90 "${bench[@]}" --phases decode --precision fp32 --decode_rounds 30 --systems "${main[@]}" \
    rposnet_precomputed --output_dir "$out/decode"
step compile 240 "${bench[@]}" --config base --phases training --compile --systems sinusoidal --lengths 512 \
    --output_dir "$out/compile"
step decode-model 60 python3 -m benchmarks.ctranslate2_decode "$model" --device cuda --threads 1 --doc ''
step generation 130 "${bench[@]}" --phases generation --generation_lengths real --precision fp32 --repeats 2 \
    --generation_batch_sizes 64 --beams 4 1 --systems "${main[@]}" "${length_options[@]}" \
    aposnet_precomputed rposnet_precomputed --output_dir "$out/generation"
