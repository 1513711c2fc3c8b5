#!/usr/bin/env bash
# The Mamba2 mixer's speed on one GPU: baton's own CUDA kernels (conv, dt,
# chunked SSD scan, gated norm: the KERN_OP_MAMBA twins) against
# transformers' NemotronH mixer on its torch path (torch_forward: F.conv1d and
# the chunked scan in torch ops; the causal-conv1d and mamba-ssm kernels are
# switched off by replacing the module's hooks, so nothing fused runs even
# where those packages are installed), on the same GPU in the same call.
#
# Both sides train the same model: a NemotronH of LAYERS Mamba2 layers
# (pattern "MMMM", hidden HIDDEN, 2*HIDDEN/64 heads of 64, n_groups 8, state
# 128, chunk 128, conv 4) and a vocabulary of 256, so that the embedding and
# the head are under 1% of the arithmetic; fp32 (baton's bf16 Mamba ops
# compute on f32 copies), rows of SEQ tokens, MB rows a step. Printed:
#   torch model    forward + backward of the whole model (loss from labels),
#                  no optimizer: tokens/s over STEPS steps after 3 warm-up
#   torch mixer    one mixer alone (its input random, the sum of its output
#                  as the loss): forward + backward tokens/s, and / LAYERS
#   baton model    `baton run --device cuda` of the same model and batch:
#                  B*T / the median step_s of steps 4..STEPS (a step is
#                  forward, backward and the AdamW update of ~all weights)
#   ratio          baton model / torch model tokens/s
# torch and transformers must be importable by $PY with CUDA; the model is
# written by transformers (random weights) under $OUT.
#
#   BUILD=build OUT=/tmp/x tools/device-mamba.sh [LAYERS] [HIDDEN] [SEQ] [MB] [STEPS]
#   (defaults: 4, 2048, 2048, 2, 12; MAMBA_DEVICE=cpu runs both sides on the
#   CPU instead: a smoke run of the script, not a measurement)
set -u
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/device-mamba}
PY=${PY:-python3}
LAYERS=${1:-4}
HIDDEN=${2:-2048}
SEQ=${3:-2048}
MB=${4:-2}
STEPS=${5:-12}
BATON=$PWD/$BUILD/baton
mkdir -p "$OUT"
. "$(dirname "$0")/device-lib.sh"
DEV=${MAMBA_DEVICE:-cuda}
if ! "$PY" -c "import torch, transformers; assert '$DEV' != 'cuda' or torch.cuda.is_available()" 2>/dev/null; then
    echo "device-mamba: torch with CUDA and transformers are not importable by $PY: nothing run"
    exit 1
fi

# the model, and transformers' torch path timed on it
"$PY" - "$OUT/model" "$LAYERS" "$HIDDEN" "$SEQ" "$MB" "$STEPS" > "$OUT/torch.txt" 2> "$OUT/torch.err" <<'PY'
import os, sys, time, torch
import torch.nn.functional as F
import transformers.models.nemotron_h.modeling_nemotron_h as mod
from transformers import NemotronHConfig, NemotronHForCausalLM
out, L, C, T, B, steps = sys.argv[1], *map(int, sys.argv[2:])
dev = os.environ.get("MAMBA_DEVICE", "cuda")  # cpu: a smoke run of the script itself
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

# the torch path: no fused split-conv-scan kernel (its fallback returns None,
# which sends the mixer to torch_forward), and the depthwise conv as F.conv1d
mod.mamba2_split_conv1d_scan_combined = lambda *a, **k: None
calls = [0]
def conv_torch(x, weight, bias=None, activation=None, **kwargs):
    calls[0] += 1
    y = F.conv1d(x.to(weight.dtype), weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1,
                 groups=x.shape[1])[:, :, :x.shape[-1]]
    return (F.silu(y) if activation in ("silu", "swish") else y).to(x.dtype)
mod.causal_conv1d_fn = conv_torch

heads = 2 * C // 64
cfg = NemotronHConfig(vocab_size=256, hidden_size=C, max_position_embeddings=max(T, 4096),
                      hybrid_override_pattern="M" * L, mamba_num_heads=heads, mamba_head_dim=64,
                      n_groups=8, ssm_state_size=128, conv_kernel=4, expand=2, chunk_size=128,
                      num_attention_heads=8, num_key_value_heads=8, head_dim=C // 8,
                      intermediate_size=4 * C, mlp_hidden_act="relu2", mamba_hidden_act="silu",
                      tie_word_embeddings=False, use_bias=False, use_conv_bias=True,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
model = NemotronHForCausalLM(cfg).float()
model.save_pretrained(out)
model = model.to(dev).train()
ids = torch.randint(0, 256, (B, T), device=dev)

def rate(step):
    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return B * T * steps / (time.perf_counter() - t0)

def model_step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

mixer = model.model.layers[0].mixer
x = torch.randn(B, T, C, device=dev, requires_grad=True)
def mixer_step():
    mixer.zero_grad(set_to_none=True)
    x.grad = None
    mixer(x).sum().backward()

print("torch_model_tok_s %.1f" % rate(model_step))
assert calls[0] > 0, "the mixer did not take the torch path"
print("torch_mixer_tok_s %.1f" % rate(mixer_step))
print("torch_peak_mib %.0f" % (torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else 0))
import transformers
print("torch %s transformers %s on %s" % (torch.__version__, transformers.__version__,
                                         torch.cuda.get_device_name() if dev == "cuda" else dev))
PY
rc=$?
if [ $rc -ne 0 ]; then
    echo "device-mamba: the torch side failed (rc $rc):"; tail -5 "$OUT/torch.err"; exit 1
fi
val() { sed -n "s/^$1 //p" "$OUT/torch.txt"; }

# baton on the same model and batch
"$PY" -c "import random; random.seed(1); print(' '.join(str(random.randrange(256)) for _ in range($((MB * SEQ * (STEPS + 2) + 1)))))" \
    > "$OUT/tokens.txt"
mkdir -p "$OUT/data" && mv "$OUT/tokens.txt" "$OUT/data/tokens.txt"
cat > "$OUT/job.yaml" <<YAML
model: {hf: $OUT/model}
data: {dir: $OUT/data, seq_len: $SEQ, split: 0}
train: {steps: $STEPS, micro_batch: $MB, grad_accum: 1, seed: 1, log_every: 1}
optim: {lr: 0.0001, min_lr: 0.0001, warmup: 0}
device: $DEV
dtype: fp32
metrics: {file: $OUT/baton.jsonl}
YAML
if ! "$BATON" run "$OUT/job.yaml" --quiet > "$OUT/baton.log" 2>&1; then
    echo "device-mamba: baton run failed:"; tail -5 "$OUT/baton.log"; exit 1
fi
bt=$("$PY" - "$OUT/baton.jsonl" "$MB" "$SEQ" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l]
s = [r["step_s"] for r in rows[3:]]
print("%.1f %d" % (int(sys.argv[2]) * int(sys.argv[3]) / statistics.median(s), len(s)) if s else "nan 0")
PY
)
tm=$(val torch_model_tok_s)
tx=$(val torch_mixer_tok_s)
echo "model: NemotronH, $LAYERS Mamba2 layers, hidden $HIDDEN, $((2 * HIDDEN / 64)) heads x 64, n_groups 8, state 128, chunk 128, vocab 256; fp32; $MB x $SEQ tokens a step"
val torch
printf '%-40s %14s\n' "what" "tokens/s"
printf '%-40s %14s\n' "torch model fwd+bwd (torch_forward)" "$tm"
printf '%-40s %14s\n' "torch one mixer fwd+bwd" "$tx"
printf '%-40s %14s\n' "torch mixer rate / $LAYERS ($LAYERS mixers)" "$(awk -v a="$tx" -v l="$LAYERS" 'BEGIN { printf "%.1f", a / l }')"
printf '%-40s %14s\n' "baton model train step (${bt#* } steps)" "${bt% *}"
printf '%-40s %14s\n' "ratio baton model / torch model" "$(awk -v a="${bt% *}" -v b="$tm" 'BEGIN { printf "%.3f", a / b }')"
echo "torch peak allocated: $(val torch_peak_mib) MiB; baton's last metrics line:"
tail -1 "$OUT/baton.jsonl"
