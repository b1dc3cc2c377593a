#!/usr/bin/env bash
# multihost.sh: data-parallel training across "hosts" (docs/DISTRIBUTED.md).
#
# Each host is a network namespace of this machine (frmh-1 ... frmh-4) with
# one veth link, address 10.213.0.1N/24, to a bridge in a switch namespace
# (frmh-sw); mpirun runs in a control namespace (frmh-c, 10.213.0.1) and
# starts its daemons on the hosts through tests/netns-rsh.sh (Open MPI's
# remote-shell agent: `ip netns exec`; the hostfile names the hosts frmh-N,
# which is also their host name), one rank per host, over TCP only
# (`--mca btl tcp,self`: no shared-memory transport), on the test subnet
# only (btl/oob_tcp_if_include). Nothing is routed outside the namespaces
# this script makes, and it removes them on exit, whatever ends it
# (trap; leftovers of a killed earlier run are removed at start).
#
#   bash tests/multihost.sh [BUILD]           the cases below; last line
#                                             "N passed, N failed, N skipped"
#   bash tests/multihost.sh --bench [BUILD]   the overlap table (bench/RESULTS.md)
#   MULTIHOST_CASES="kill-rank link-down" bash tests/multihost.sh   only those
#
# Cases (ResNet-8; tests/test_dist.c's cases run on every rank):
#  exact-2x16, exact-4x8: 2 hosts x 16 and 4 hosts x 8 end 5 SGD steps with
#    the parameters of 1 process x 32 with --accum 2 / --accum 4 (2 ranks:
#    bit for bit; 4: 1e-6 relative; sync-bn-*: one synchronised-BN step
#    against batch 32, parameters and running statistics to 1e-6);
#  faults, each while `train` runs on the hosts; mpirun and every rank on
#  every host must be gone within 30 s of the fault and the output must name
#  the failed rank and host (mpirun's process map, --display-map, ties ranks to hosts
#  where mpirun's own message names only the host):
#  kill-rank: rank 2 (frmh-3) is killed (SIGKILL) mid-training;
#  link-down: frmh-3's link is set down mid-training on 100 Mbit/s links,
#    where the gradient all-reduce takes a third of a step or more (the
#    moment within the step is not chosen);
#    mpirun finds the lost daemon by TCP keepalive (oob_tcp_keepalive_*,
#    3 s + 7 x 2 s), frmh-3's daemon finds the lost mpirun the same way and
#    ends its rank; link-down-rank0: the same for frmh-1, whose daemon
#    also forwards rank 0's output to mpirun. A daemon cut off while it
#    sends (rank 0's output) waits for TCP's retransmission limit instead
#    (minutes), and so would its rank: train's --dist-timeout 25 ends such
#    a rank itself (dist/watchdog.c); a daemon left up is printed, not
#    failed;
#  packet-loss: once training runs, every host drops 20% of the packets it
#    receives (iptables statistic match); 2 hosts must still finish an epoch
#    of 5 steps;
#  die-in-save: rank 0 is stopped while it writes a --save checkpoint (an
#    open file in the checkpoint's folder), the file as it is then is
#    copied, and rank 0 is killed: the checkpoint must still be that file.
# With iptables, every host's firewall drops what docs/DISTRIBUTED.md's
# launch line does not need: only TCP to mpirun's and MPI's fixed ports
# (46000-46199, from the test subnet) and replies get in, so the documented
# port options are tested too. Delay is not emulated: this kernel has no
# netem; tbf (--bench) limits rate only.
set -u
bench=0
[ "${1:-}" = "--bench" ] && { bench=1; shift; }
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$build" in /*) ;; *) build="$root/$build" ;; esac
pass=0 fail=0 skip=0
summary() { echo "$pass passed, $fail failed, $skip skipped"; }
skip_all() {
    echo "multihost: SKIP: $1"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
}

[ "$(id -u)" -eq 0 ] || skip_all "not root: making network namespaces needs CAP_NET_ADMIN"
for c in ip mpirun flock timeout python3; do
    command -v "$c" >/dev/null || skip_all "no $c on PATH"
done
need=(tests/test_dist examples/train)
[ $bench = 1 ] && need+=(bench/bench_dist)
for b in "${need[@]}"; do
    [ -x "$build/$b" ] || skip_all "$build/$b is not built (make -j2 all tests $build/bench/bench_dist)"
done
ldd "$build/examples/train" | grep -q libmpi || skip_all "frugal was built without MPI"
# the fault cases train on Fashion-MNIST (train's default data set)
fmnist=$("$build/examples/train" --help 2>&1 | sed -n 's/.*(default, DIR \([^)]*\)).*/\1/p')
have_data=0
[ -n "$fmnist" ] && [ -r "$fmnist" ] && have_data=1

# One run at a time on this machine: the names below are fixed.
exec 9>/run/lock/frugal-multihost.lock 2>/dev/null || exec 9>/tmp/frugal-multihost.lock
flock -w 900 9 || skip_all "another multihost.sh still holds /run/lock/frugal-multihost.lock"

tmp=""
teardown() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^frmh-/ {print $1}'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    [ -n "$tmp" ] && rm -rf "$tmp"
}
trap teardown EXIT
trap 'echo "multihost: interrupted"; exit 130' INT
trap 'exit 143' TERM HUP
teardown # an earlier run killed before its trap ran
ip netns add frmh-probe 2>/dev/null || skip_all "cannot make a network namespace (ip netns add failed)"
ip netns del frmh-probe
tmp=$(mktemp -d /tmp/frugal-multihost.XXXXXX)

SUBNET=10.213.0.0/24
PORTS=46000:46199 # mpirun's daemons 46000-46099, the ranks 46100-46199
have_iptables=0
command -v iptables >/dev/null && have_iptables=1
# cluster N [RATE]: the switch, the control namespace and hosts 1..N; with
# RATE (tc's units, e.g. 1gbit) every link is limited to it both ways (tbf
# on the host's end and on the switch's end).
cluster() {
    local n=$1 rate=${2:-} i
    teardown
    tmp=$(mktemp -d /tmp/frugal-multihost.XXXXXX)
    ip netns add frmh-sw || return 1
    ip -n frmh-sw link set lo up
    ip -n frmh-sw link add br0 type bridge && ip -n frmh-sw link set br0 up || return 1
    for i in c $(seq 1 "$n"); do
        local ns=frmh-$i addr=10.213.0.1
        [ "$i" = c ] || addr=10.213.0.$((10 + i))
        ip netns add "$ns" || return 1
        ip link add "p-$i" netns frmh-sw type veth peer name eth0 netns "$ns" || return 1
        ip -n frmh-sw link set "p-$i" master br0 up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        # the firewall docs/DISTRIBUTED.md gives: only mpirun's and MPI's ports
        if [ "$i" != c ] && [ $have_iptables = 1 ]; then
            ip netns exec "$ns" iptables -A INPUT -i lo -j ACCEPT &&
                ip netns exec "$ns" iptables -A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT &&
                ip netns exec "$ns" iptables -A INPUT -p tcp -s "$SUBNET" --dport "$PORTS" -j ACCEPT &&
                ip netns exec "$ns" iptables -P INPUT DROP || return 1
        fi
        if [ -n "$rate" ]; then
            # burst: 64 KiB segments (veth's GSO) must fit; latency bounds the queue
            ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms || return 1
            ip netns exec frmh-sw tc qdisc add dev "p-$i" root tbf rate "$rate" burst 256kb latency 50ms || return 1
        fi
    done
    # ready when every link is up at both ends and the bridge forwards on it
    for i in c $(seq 1 "$n"); do
        local k=0
        until ip -n "frmh-$i" link show eth0 | grep -q LOWER_UP &&
            ip -n frmh-sw -d link show "p-$i" | grep -q 'state forwarding'; do
            k=$((k + 1))
            [ $k -lt 100 ] || { echo "multihost: link of frmh-$i not up after 10 s" >&2; return 1; }
            sleep 0.1
        done
    done
    : >"$tmp/hosts"
    for i in $(seq 1 "$n"); do echo "frmh-$i slots=1" >>"$tmp/hosts"; done
}

# mpi NP LIMIT CMD...: mpirun in the control namespace, killed after LIMIT s.
# Every daemon talks to mpirun directly (routed direct: no daemon relays
# another's messages, so a lost host loses only its own). Keepalive on mpirun's own connections (3 s idle, then 7 probes 2 s apart)
# is what finds a host whose link went down; without it the job waits on.
mpi() {
    local np=$1 limit=$2
    shift 2
    ip netns exec frmh-c timeout -s KILL "$limit" mpirun --allow-run-as-root --oversubscribe -np "$np" \
        --hostfile "$tmp/hosts" --display-map --bind-to none --mca plm_rsh_agent "$root/tests/netns-rsh.sh" \
        --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" --mca routed direct \
        --mca oob_tcp_dynamic_ipv4_ports 46000-46099 --mca btl_tcp_port_min_v4 46100 --mca btl_tcp_port_range_v4 100 \
        --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 7 \
        -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 "$@"
}

ok() { echo "ok   $1${2:+: $2}"; pass=$((pass + 1)); }
bad() { echo "FAIL $1${2:+: $2}"; fail=$((fail + 1)); }
skipped() { echo "SKIP $1: $2"; skip=$((skip + 1)); }

# host_procs: "NAMESPACE PID COMM WCHAN" for each process left on the hosts
host_procs() {
    local ns p
    for ns in $(ip netns list | awk '$1 ~ /^frmh-[0-9]/ {print $1}'); do
        for p in $(ip netns pids "$ns"); do
            echo "$ns $p $(cat /proc/"$p"/comm 2>/dev/null) $(cat /proc/"$p"/wchan 2>/dev/null)"
        done
    done
}
# ranks (train processes) left on the hosts
left() { host_procs | awk '$3 == "train"' | wc -l; }

# rank_pid HOST: the pid of `train` in namespace frmh-HOST (one rank per host)
rank_pid() {
    local p
    for p in $(ip netns pids "frmh-$1"); do
        [ "$(cat /proc/"$p"/comm 2>/dev/null)" = train ] && { echo "$p"; return 0; }
    done
    return 1
}

exact_case() { # NAME HOSTS CASE
    local name=$1 n=$2 c=$3
    cluster "$n" || { bad "$name" "could not make $n hosts"; return; }
    local out
    out=$(mpi "$n" 120 "$build/tests/test_dist" --case "$c" --dir "$tmp" 2>&1)
    local rc=$? passed
    passed=$(grep -c "^ok   $c" <<<"$out")
    grep '^    ' <<<"$out" | sed 's/^/   | /'
    if [ $rc -eq 0 ] && [ "$passed" -eq "$n" ]; then
        ok "$name" "$n hosts over TCP, every rank passed"
    else
        echo "$out" | tail -40 | sed 's/^/   | /'
        bad "$name" "mpirun exit $rc, $passed of $n ranks passed"
    fi
}

train_args=(--model resnet8 --batch 16 --limit-test 32 --log-every 1)

# fault_wait NAME T0 PID HOST RANK: waits for mpirun (PID) and every rank to
# end, at most 30 s after T0 (when the fault was made), then checks the
# output names the rank and the host.
fault_wait() {
    local name=$1 t0=$2 pid=$3 host=$4 rank=$5 log="$tmp/$1.log"
    while :; do
        local now
        now=$(date +%s.%N)
        if ! kill -0 "$pid" 2>/dev/null && [ "$(left)" -eq 0 ]; then break; fi
        if awk -v a="$now" -v b="$t0" 'BEGIN { exit !(a - b > 30) }'; then
            tr '\r' '\n' <"$log" | grep -v '^epoch' | tail -30 | sed 's/^/   | /'
            host_procs | sed 's/^/   | left: /'
            local up=no
            kill -0 "$pid" 2>/dev/null && up=yes
            bad "$name" "not over 30 s after the fault: $(left) ranks on the hosts, mpirun running: $up"
            kill -9 "$pid" 2>/dev/null
            teardown
            return
        fi
        sleep 0.2
    done
    wait "$pid"
    local rc=$? secs
    secs=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
    # Open MPI's daemon on a cut-off host can outlive its ranks: it ends by
    # keepalive only if its connection to mpirun had nothing unacknowledged
    # at the cut (docs/DISTRIBUTED.md, "Faults"); said, not failed
    host_procs | sed 's/^/   | still up (not a rank): /'

    local text
    text=$(tr '\r' '\n' <"$log" | grep -v '^epoch')
    # the rank: mpirun's message, else the map's line for that host's rank
    local named_rank=0 named_host=0
    grep -q "rank $rank .*on node $host" <<<"$text" && named_rank=1
    grep -Eq "Process OMPI jobid: \[[^]]*\] App: 0 Process rank: $rank Bound" <<<"$(awk -v h="$host" '
        /Data for node:/ { on = index($0, "Data for node: " h "\t") > 0 } on' <<<"$text")" && named_rank=1
    grep -q "$host" <<<"$text" && named_host=1
    grep -E 'noticed|lost communication|Remote daemon|exited on signal|ORTE has' <<<"$text" | sed 's/^/   | /'
    if [ $rc -ne 0 ] && [ $named_rank = 1 ] && [ $named_host = 1 ]; then
        ok "$name" "every rank ended ${secs} s after the fault, mpirun exit $rc, rank $rank and $host named"
    else
        echo "$text" | tail -30 | sed 's/^/   | /'
        bad "$name" "mpirun exit $rc after ${secs} s; rank $rank named: $named_rank, host $host named: $named_host"
    fi
}

# start_train NAME NP ARGS...: train in the background (log $tmp/NAME.log);
# waits until rank 0 has made $ready steps (3). Sets $job.
start_train() {
    local name=$1 np=$2
    shift 2
    mpi "$np" 240 "$build/examples/train" "${train_args[@]}" "$@" >"$tmp/$name.log" 2>&1 &
    job=$!
    for _ in $(seq 600); do
        grep -q "step ${ready:-3}/" "$tmp/$name.log" 2>/dev/null && return 0
        kill -0 $job 2>/dev/null || break
        sleep 0.1
    done
    tr '\r' '\n' <"$tmp/$name.log" | tail -20 | sed 's/^/   | /'
    return 1
}

case_kill_rank() {
    cluster 4 || { bad kill-rank "could not make 4 hosts"; return; }
    start_train kill-rank 4 --limit-train 8192 --epochs 1 || { bad kill-rank "train did not start"; return; }
    local p
    p=$(rank_pid 3) || { bad kill-rank "no train process on frmh-3"; return; }
    kill -9 "$p"
    fault_wait kill-rank "$(date +%s.%N)" "$job" frmh-3 2
}

# link_down NAME HOST RANK: on 100 Mbit/s links (a step's gradients take a
# while on the wire), HOST's switch port goes down mid-training
link_down() {
    local name=$1 host=$2 rank=$3
    cluster 4 100mbit || { bad "$name" "could not make 4 hosts"; return; }
    start_train "$name" 4 --limit-train 8192 --epochs 1 --dist-timeout 25 || { bad "$name" "train did not start"; return; }
    ip -n frmh-sw link set "p-$host" down
    fault_wait "$name" "$(date +%s.%N)" "$job" "frmh-$host" "$rank"
}

case_packet_loss() {
    cluster 2 || { bad packet-loss "could not make 2 hosts"; return; }
    local i t0
    [ $have_iptables = 1 ] || { skipped packet-loss "no iptables (scripts/install-deps.sh installs it)"; return; }
    t0=$(date +%s)
    # the loss begins once training runs (Open MPI's start-up gives up on
    # daemons whose connections lose their first packets)
    ready=1 start_train packet-loss 2 --limit-train 160 --epochs 1 || { bad packet-loss "train did not start"; return; }
    for i in 1 2; do
        if ! ip netns exec "frmh-$i" iptables -I INPUT 1 -m statistic --mode random --probability 0.2 -j DROP \
            2>"$tmp/iptables.err"; then
            skipped packet-loss "iptables cannot drop packets at random here: $(head -1 "$tmp/iptables.err")"
            kill -9 "$job"
            return
        fi
    done
    wait "$job"
    local rc=$? dropped
    dropped=$(ip netns exec frmh-2 iptables -L INPUT -v -x -n | awk '/statistic/ {print $1}')
    if [ $rc -eq 0 ] && tr '\r' '\n' <"$tmp/packet-loss.log" | grep -q 'epoch 1/1: .*test'; then
        ok packet-loss "5 steps on 2 hosts in $(($(date +%s) - t0)) s, 20% of packets dropped ($dropped on frmh-2)"
    else
        tr '\r' '\n' <"$tmp/packet-loss.log" | grep -v '^epoch .*step' | tail -20 | sed 's/^/   | /'
        bad packet-loss "mpirun exit $rc after $(($(date +%s) - t0)) s"
    fi
}

case_die_in_save() {
    cluster 2 || { bad die-in-save "could not make 2 hosts"; return; }
    mkdir -p "$tmp/ckpt"
    local ck="$tmp/ckpt/run.safetensors"
    # epochs of 2 steps, a checkpoint after each: ResNet-20's (about 2 MiB with momentum)
    train_args=(--model resnet20 --batch 16 --limit-test 16 --log-every 1)
    ready=2 start_train die-in-save 2 --limit-train 64 --epochs 100 --save "$ck"
    local started=$?
    train_args=(--model resnet8 --batch 16 --limit-test 32 --log-every 1)
    [ $started = 0 ] || { bad die-in-save "train did not start"; return; }
    local p
    p=$(rank_pid 1) || { bad die-in-save "no train process on frmh-1"; return; }
    # catch rank 0 with a file open in the checkpoint's folder (the temporary
    # file it writes), once a checkpoint exists; stop it there, keep a copy of
    # the checkpoint, kill it
    if ! python3 - "$p" "$tmp/ckpt" "$ck" "$tmp/before.safetensors" <<'EOF'; then
import os, shutil, signal, sys, time
pid, folder, ck, copy = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
end = time.time() + 60
while time.time() < end:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        sys.exit("rank 0 ended before it was caught writing")
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder + "/") and os.path.exists(ck):
            os.kill(pid, signal.SIGSTOP)
            try:
                still = os.readlink(f"/proc/{pid}/fd/{fd}") == target
            except OSError:
                still = False
            if still:
                shutil.copyfile(ck, copy)
                print(f"    rank 0 stopped while writing ({target}); killed")
                os.kill(pid, signal.SIGKILL)
                sys.exit(0)
            os.kill(pid, signal.SIGCONT)
sys.exit("never caught rank 0 writing a checkpoint in 60 s")
EOF
        bad die-in-save "the fault was not made"
        kill -9 "$job" 2>/dev/null
        return
    fi
    fault_wait die-in-save "$(date +%s.%N)" "$job" frmh-1 0
    if cmp -s "$ck" "$tmp/before.safetensors"; then
        ok die-in-save-intact "the checkpoint is the one written before ($(stat -c %s "$ck") bytes, same bytes)"
    else
        bad die-in-save-intact "the checkpoint changed or is gone"
    fi
}

# bench_overlap: bench_dist (bench/bench_dist.c) on 2 hosts, one rank and
# one thread each, with every link limited by tbf, overlap off and on, for
# each model, rate and bucket size; the runs of one setting alternate (off,
# on) and repeat (MULTIHOST_REPEAT, 3), and bench/overlap_table.py keeps the
# medians. The hosts share this machine's clock, so bench_dist's exposed
# all-reduce (latest all-reduce end minus latest backward end, per step)
# compares across them.
bench_overlap() {
    local reps=${MULTIHOST_REPEAT:-3} batch=${MULTIHOST_BATCH:-32} steps=${MULTIHOST_STEPS:-8}
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "2 hosts x 1 rank x 1 thread, global batch $batch, $steps steps after 2 warm-up, median of $reps runs"
    echo "| model | link | buckets | step ms, overlap off | step ms, on | all-reduce ms | exposed ms, on | hidden ms |"
    echo "|---|---|---|---|---|---|---|---|"
    local model rate bucket k
    for model in ${MULTIHOST_MODELS:-resnet20 resnet56}; do
        for rate in ${MULTIHOST_RATES:-1gbit 100mbit}; do
            cluster 2 "$rate" || { echo "multihost: could not make 2 hosts at $rate"; return 1; }
            for bucket in ${MULTIHOST_BUCKETS:-default 0.25 0.05}; do
                local args=(--model "$model" --batch "$batch" --steps "$steps")
                [ "$bucket" = default ] || args+=(--bucket-mb "$bucket")
                : >"$tmp/off"
                : >"$tmp/on"
                for k in $(seq "$reps"); do
                    mpi 2 300 "$build/bench/bench_dist" "${args[@]}" --no-overlap 2>&1 | grep 'images/s' >>"$tmp/off"
                    mpi 2 300 "$build/bench/bench_dist" "${args[@]}" 2>&1 | grep 'images/s' >>"$tmp/on"
                done
                python3 "$root/bench/overlap_table.py" "$model" "$rate" "$bucket" "$tmp/off" "$tmp/on"
            done
        done
    done
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

if [ $bench = 1 ]; then
    bench_overlap
    exit $?
fi

# MULTIHOST_CASES="kill-rank link-down ..." runs only those
want() { [ -z "${MULTIHOST_CASES:-}" ] || [[ " $MULTIHOST_CASES " == *" $1 "* ]]; }
want exact-2x16 && exact_case exact-2x16 2 exact-hosts
want sync-bn-2x16 && exact_case sync-bn-2x16 2 sync-bn-hosts
want exact-4x8 && exact_case exact-4x8 4 exact-hosts
want sync-bn-4x8 && exact_case sync-bn-4x8 4 sync-bn-hosts
if [ $have_data = 1 ]; then
    want kill-rank && case_kill_rank
    want link-down && link_down link-down 3 2
    want link-down-rank0 && link_down link-down-rank0 1 0
    want packet-loss && case_packet_loss
    want die-in-save && case_die_in_save
else
    skipped "the fault cases" "train's data set, Fashion-MNIST, is not in ${fmnist:-its folder}"
fi
teardown
summary
[ $fail -eq 0 ]
