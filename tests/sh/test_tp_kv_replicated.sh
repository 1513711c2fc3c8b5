#!/usr/bin/env bash
# Tensor parallelism over more ranks than KV heads (model/attention.c: each
# KV head replicated over tp / kv_heads ranks): jobs/tiny_hf.yaml's model has
# 4 query and 2 KV heads. tp=4 as processes trains as tp=1 does (every step's
# loss within 1e-5), and its checkpoint, whose k/v are whole on every rank,
# resumes at tp=2, where they are split by heads, with the same losses.
set -u
. "$(dirname "$0")/lib.bash"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
job() { # NAME TP [ARGS...]
    local name=$1 tp=$2
    shift 2
    "$BATON" run jobs/tiny_hf.yaml --quiet --set parallel.tp=$tp --set train.steps=10 \
        --set metrics.file="$tmp/$name.jsonl" --set metrics.plot="" "$@" >"$tmp/$name.log" 2>&1 ||
        fail "tp_kv_$name" "exit $?: $(tail -3 "$tmp/$name.log")"
}
losses() { grep -o '"loss": [-0-9.eE+]*' "$tmp/$1.jsonl" | sed 's/"loss": //'; }
same_losses() { # NAME A B: the last N losses of A and B agree (N: B's count)
    local n ok=1
    n=$(losses "$3" | wc -l)
    [ "$n" -gt 0 ] || ok=0
    while read -r a b; do rel_close "$a" "$b" 1e-5 || ok=0; done < <(paste <(losses "$2" | tail -n "$n") <(losses "$3"))
    if [ $ok = 1 ]; then pass "$1"; else fail "$1" "$(paste <(losses "$2" | tail -n "$n") <(losses "$3") | tr '\n' ';')"; fi
}
job tp1 1
job tp4 4
same_losses tp_kv_replicated_tp4_equals_tp1 tp1 tp4
job tp4_first 4 --set train.stop_after=5 --set checkpoint.dir="$tmp/ck" --set checkpoint.every=5
job tp2_resumed 2 --set checkpoint.dir="$tmp/ck" --set checkpoint.every=5 --resume latest
same_losses tp_kv_replicated_resumes_at_tp2 tp1 tp2_resumed
