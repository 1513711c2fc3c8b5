#!/usr/bin/env bash
# Device call of 3 Dec 2026 (session 7, call D): the binaries in build/h1x/d
# (main with a GPU per rank, the reworked nccl watchdog, MoE, MLA, Mamba2 and
# context parallelism). What this call checks:
#   - how many GPUs the driver sees without loading CUDA (the rule that gives
#     the k-th rank of a host cuda:(k mod GPUs))
#   - the nccl backend's one-GPU check: a call stuck behind its blocked
#     stream must now be failed by the watchdog at the step timeout, not when
#     the stream lets go (8 s on 2 Dec)
#   - the model check, now with the MoE, MLA and hybrid fixtures and CP
#     layouts sharing the one GPU
# Outputs in $OUT.
set -u
B=build/h1x/d
tar -C $B -xJf $B/devpack.tar.xz
cat $B/BUILD_INFO
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}; /proc/driver/nvidia/gpus: $(ls /proc/driver/nvidia/gpus 2>/dev/null | tr '\n' ' ')"
BUILD=$B OUT=$OUT/nccl timeout 150 tools/device-nccl-check.sh > $OUT/nccl-check.txt 2>&1; echo "nccl rc $?"
grep -E "PASS|FAIL|watchdog|abort|elapsed|passed" $OUT/nccl-check.txt | tail -30
BUILD=$B OUT=$OUT/model timeout 420 tools/device-model-check.sh > $OUT/model-check.txt 2>&1; echo "model rc $?"
grep -E "FAIL|one GPU|eval (mixtral|qwen2_moe|deepseek|nemotron)|generate" $OUT/model-check.txt
grep -h "device\|collectives" $OUT/model/train_gpu_cp*.log 2>/dev/null | head -6
tail -2 $OUT/model-check.txt
