#!/usr/bin/env bash
# Device call P (6 Dec 2026, session 11): sliding-window models on the GPU
# through cuDNN (BATON_CUDA_ATTN=cudnn), binaries of B: loss and gradient norm
# of the window fixtures (sequences longer than their windows) on cuda bf16
# against transformers' expected.json, and the refusal without cuDNN's path.
set -u
B=${B:-build/h1x/p}
BUILD=$B; . tools/device-lib.sh
printf '%-44s %-22s %-22s %-10s %-8s %s\n' check gpu reference rel tol result | tee $OUT/summary.txt
for f in mistral_window qwen2_window; do
    d=tests/fixtures/$f
    j=$(BATON_CUDA_ATTN=cudnn $B/baton eval --model $d --ids $d/ids.txt --device cuda --dtype bf16 \
        --json --grad-norm 2>>$OUT/log.txt | tail -1)
    e=$(cat $d/expected.json)
    row "$f bf16 cudnn loss" "$(field loss "$j")" "$(field loss "$e")" 1e-2 | tee -a $OUT/summary.txt
    row "$f bf16 cudnn grad_norm" "$(field grad_norm "$j")" "$(field grad_norm "$e")" 2e-2 | tee -a $OUT/summary.txt
    $B/baton eval --model $d --ids $d/ids.txt --device cuda --dtype bf16 --json > /dev/null 2>$OUT/refuse-$f.txt
    echo "$f without BATON_CUDA_ATTN=cudnn: rc=$? $(grep -o 'sliding_window=[^;]*' $OUT/refuse-$f.txt | head -1 | cut -c1-200)" | tee -a $OUT/summary.txt
done
echo "failures: $fails" | tee -a $OUT/summary.txt
