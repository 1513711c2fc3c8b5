#!/usr/bin/env bash
# Device call L (6 Dec 2026, session 11): cuDNN's SDPA graphs as baton's
# attention (BATON_CUDA_ATTN=cudnn, kernels/cuda/dnn.cu). The libraries the
# machine has, the op table's attention rows (the cudnn rows beside the own
# kernels', sliding windows included), then the llama134m and SmolLM2 rows of
# the benchmark with the fast and cudnn paths and torch.compile in the same call.
set -u
B=${B:-build/h1x/l}
ROWS=${ROWS:-llama134m smollm2}
BUILD=$B; . tools/device-lib.sh
call_start
sum "libraries: $(ldconfig -p | grep -oE 'lib(cudnn|cudnn_graph|nvrtc|cublasLt|cudart)\.so\.[0-9.]+' | sort -u | tr '\n' ' ')"
a=$SECONDS
timeout 200 $B/device/test_cuda_ops attention > $OUT/ops-attention.txt 2>&1
sum "ops attention: rc=$? $((SECONDS - a)) s; $(tail -1 $OUT/ops-attention.txt)"
grep -E "^# cu|FAIL" $OUT/ops-attention.txt | head -40 | tee -a $OUT/summary.txt
a=$SECONDS
OUT=$OUT/bench BUILD=$B ROWS="$ROWS" ATTN="fast cudnn" BUDGET=$((570 - SECONDS)) \
    bench/gpu_bench.sh > $OUT/bench.txt 2>&1
sum "gpu_bench $ROWS: rc=$? $((SECONDS - a)) s"
grep -E "(b-fast|b-dnn|torch):|cuDNN|cudnn" $OUT/bench.txt | head -20 | tee -a $OUT/summary.txt
cat $OUT/bench/table.txt 2>/dev/null | head -30 | tee -a $OUT/summary.txt
sum "end: $SECONDS s"
