# Sourced (after lib.bash) by the tests that run a job over ssh on hosts
# simulated as network namespaces: tests/sh/test_ssh.sh and the fault
# campaigns of tests/faults/ (not a test itself: tests/run.sh runs *.sh).
#
#   netns_init            root, sshd and ssh or SKIP (exit 0); a temporary
#                         directory $tmp, generated host and user keys, an
#                         ssh_config for them ($tmp/ssh_config, port $port),
#                         the cleanup trap (every sshd, namespace, link and
#                         the process in $driver), the training tokens
#   sshd_config NAME ADDR a server config of the test's own
#   sshd_start NAME ADDR [NS]  an sshd on ADDR:$port (in namespace NS)
#   wait_ssh DEST         poll until a command runs there
#   netns_hosts N         N hosts: namespaces on one bridge ($net.1 is this
#                         machine's side), host i at $net.1i with its own
#                         sshd; fills ns[] and hosts[]; SKIP (exit 0) when
#                         `ip netns` does not work here
#   job NAME HOSTS [SSH_ARGS [LAUNCH_FIELDS [TRAIN]]]  the job $tmp/NAME.yaml
#   losses FILE           the losses of a metrics file, one line
SSHD=${SSHD:-/usr/sbin/sshd}
ns=(); links=(); sshd_pids=(); driver=
netns_cleanup() {
    local p n
    [ -n "$driver" ] && kill -9 "$driver" 2>/dev/null
    for p in "${sshd_pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${sshd_pids[@]}"; do wait "$p" 2>/dev/null; done
    for n in "${ns[@]}"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del "$n" 2>/dev/null; done
    for n in "${links[@]}"; do ip link del "$n" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}

netns_init() {
    if [ "$(id -u)" -ne 0 ] || [ ! -x "$SSHD" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
        echo "SKIP ${1:-ssh}: needs root, $SSHD and ssh (make deps installs openssh-server)"; exit 0
    fi
    BATON_ABS=$(readlink -f "$BATON")
    tmp=$(mktemp -d /tmp/test_${1:-ssh}.XXXXXX)
    chmod 755 "$tmp"
    tag=$(( $$ % 200 + 20 ))
    net=10.218.$tag
    trap netns_cleanup EXIT
    trap 'exit 1' INT TERM
    mkdir -p /run/sshd "$tmp/data"
    ssh-keygen -q -t ed25519 -N '' -f "$tmp/host_key" -C baton-test-host
    ssh-keygen -q -t ed25519 -N '' -f "$tmp/user_key" -C baton-test-user
    cp "$tmp/user_key.pub" "$tmp/authorized_keys"
    echo "* $(cut -d' ' -f1,2 "$tmp/host_key.pub")" > "$tmp/known_hosts"
    port=$(( 20000 + $$ % 20000 ))
    cat > "$tmp/ssh_config" <<EOF
Host *
    Port $port
    User root
    IdentityFile $tmp/user_key
    IdentitiesOnly yes
    UserKnownHostsFile $tmp/known_hosts
    StrictHostKeyChecking yes
    LogLevel ERROR
EOF
    lcg_tokens 7 4000 40 9 64 > "$tmp/data/tokens.txt"
}

sshd_config() {
    cat > "$tmp/sshd_$1.conf" <<EOF
ListenAddress $2:$port
HostKey $tmp/host_key
PidFile $tmp/sshd_$1.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
AcceptEnv none
EOF
}

sshd_start() {
    sshd_config "$1" "$2"
    if [ -n "${3:-}" ]; then
        ip netns exec "$3" "$SSHD" -D -e -f "$tmp/sshd_$1.conf" 2> "$tmp/sshd_$1.log" &
    else
        "$SSHD" -D -e -f "$tmp/sshd_$1.conf" 2> "$tmp/sshd_$1.log" &
    fi
    sshd_pids+=($!)
}

wait_ssh() {
    local dest=$1 i
    for i in $(seq 1 "$(scaled 300)"); do
        ssh -F "$tmp/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 "$dest" true 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

netns_hosts() {
    local i n
    if ! ip netns add "bt18-$$-probe" 2>/dev/null; then
        echo "SKIP ${2:-ssh}_netns: ip netns does not work here"; exit 0
    fi
    ip netns del "bt18-$$-probe"
    br=bt18br$tag
    ip link add "$br" type bridge && links+=("$br")
    ip addr add "$net.1/24" dev "$br"
    ip link set "$br" up
    hosts=()
    for i in $(seq 1 "$1"); do
        n=bt18-$$-h$i; ns+=("$n")
        ip netns add "$n"
        ip link add "bt18v$tag$i" type veth peer name eth0 netns "$n" && links+=("bt18v$tag$i")
        ip link set "bt18v$tag$i" master "$br" up
        ip -n "$n" link set lo up
        ip -n "$n" addr add "$net.1$i/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" route add default via "$net.1"
        sshd_start "h$i" "$net.1$i" "$n"
        hosts+=("$net.1$i")
    done
}

job() {
    cat > "$tmp/$1.yaml" <<YAML
model: {layers: 2, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 64}
data: {dir: $tmp/data, seq_len: 8, split: 0}
train: {${5:-steps: 6, micro_batch: 1, grad_accum: 2, log_every: 1}}
optim: {lr: 0.003, min_lr: 0.0003, warmup: 0}
parallel: {pp: 2, dp: 2}
metrics: {file: $tmp/$1.jsonl}
runs: $tmp/runs
hosts: $2
launch: {ssh: [-F, $tmp/ssh_config${3:-}]${4:-}}
YAML
}
losses() { sed -n 's/.*"loss": *\([-0-9.eE+]*\).*/\1/p' "$1" | tr '\n' ' '; }
