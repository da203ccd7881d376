#!/usr/bin/env bash
# netns.sh: "machines" made of Linux network namespaces, so one root shell can run an Open MPI
# job across nodes that talk over TCP only and each have their own host name.
#   netns.sh can              exit 0 if namespaces can be made here, else say why and exit 1
#   netns.sh up [N]           N nodes (default 2): namespace dpsA, dpsB, ..., host name nodeA,
#                             nodeB, ..., address 10.77.0.1, .2, ... on eth0; lo up in each
#   netns.sh down             remove them (idempotent)
#   netns.sh exec NODE CMD... run CMD on NODE (nodeB, dpsB or 10.77.0.2) under its host name
#   netns.sh agent [OPTS] HOST CMD...   Open MPI's rsh agent: as ssh, CMD is one shell line
#   netns.sh mpirun ARGS...   mpirun on the first node with the hostfile (every node, 4 slots)
#                             and the agent, TCP between nodes
#   netns.sh launch PROG ARGS...   the same with PROG in mpirun's place (dpshim-run)
#   netns.sh cut NODE... | heal   NODE's switch port drops everything (a silent partition) | undo
# Each node's eth0 is one end of a veth pair whose other end is a port of a bridge (the switch)
# in a namespace of its own, dpsnet.
# Nodes share the file system, /dev/shm and the process ids: only the network and the host name
# differ, which is what Open MPI and the shim use to tell nodes apart.
# DPS_NETNS_PREFIX (default dps) names the namespaces, so that two test runs at once each have
# their own nodes (each set is a network of its own: the addresses may repeat).
set -euo pipefail

SELF=$(realpath "$0")
PREFIX=${DPS_NETNS_PREFIX:-dps}
[[ $PREFIX =~ ^[a-z][a-z0-9]{0,11}$ ]] || { echo "netns.sh: DPS_NETNS_PREFIX: 1-12 lower-case letters and digits" >&2; exit 2; }
HUB=${PREFIX}net
SUBNET=10.77.0
SLOTS=4
STATE=/run/dpshim-netns/$PREFIX
LETTERS=(A B C D E F G H)

die() {
    echo "netns.sh: $*" >&2
    exit 1
}

# The nodes that are up, one "namespace hostname address" line each, from the state file `up`
# wrote.
nodes() {
    [ -f "$STATE/nodes" ] || die "no nodes: run 'netns.sh up' first"
    cat "$STATE/nodes"
}

# node_of NAME: sets node_ns and node_host to those of the node whose namespace, host name or
# address is NAME.
node_of() {
    local ns host addr list
    list=$(nodes)
    while read -r ns host addr; do
        if [ "$1" = "$ns" ] || [ "$1" = "$host" ] || [ "$1" = "$addr" ]; then
            node_ns=$ns node_host=$host
            return
        fi
    done <<<"$list"
    die "no node named '$1' (nodes: $(awk '{ printf "%s ", $2 }' <<<"$list"))"
}

can() {
    [ "$(id -u)" = 0 ] || { echo "network namespaces need root (running as $(id -un))"; return 1; }
    for tool in ip bridge unshare hostname; do
        command -v $tool >/dev/null || { echo "'$tool' is missing (apt-get install iproute2 util-linux hostname)"; return 1; }
    done
    # try the real thing: a namespace, a bridge, a veth pair and a UTS namespace
    local probe=${PREFIX}probe$$ err
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "cannot create a network namespace: $err"
        return 1
    fi
    if ! err=$(ip -n "$probe" link add name br0 type bridge 2>&1); then
        ip netns del "$probe"
        echo "cannot create a bridge in a namespace: $err"
        return 1
    fi
    if ! err=$(ip -n "$probe" link add name p0 type veth peer name p1 2>&1); then
        ip netns del "$probe"
        echo "cannot create a veth pair in a namespace: $err"
        return 1
    fi
    ip netns del "$probe"
    if ! err=$(unshare --uts hostname "$probe" 2>&1); then
        echo "cannot set a host name in a UTS namespace: $err"
        return 1
    fi
}

down() {
    local ns
    for ns in $(ip netns list | awk -v p="^${PREFIX}[A-H]\$|^${HUB}\$" '$1 ~ p { print $1 }'); do
        # a namespace's processes keep it alive after `ip netns del`: leave none behind
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns"
    done
    rm -rf "$STATE"
    rmdir "$(dirname "$STATE")" 2>/dev/null || true # the last set of nodes gone
}

up() {
    local n=${1:-2} i
    if [ "$n" -lt 2 ] || [ "$n" -gt ${#LETTERS[@]} ]; then die "up: 2 to ${#LETTERS[@]} nodes, not '$n'"; fi
    down
    mkdir -p "$STATE"
    ip netns add "$HUB"
    ip -n "$HUB" link add name br0 type bridge
    ip -n "$HUB" link set br0 up
    for ((i = 0; i < n; i++)); do
        local letter=${LETTERS[i]} ns=$PREFIX${LETTERS[i]} addr=$SUBNET.$((i + 1))
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link add name eth0 type veth peer name "port$letter" netns "$HUB"
        ip -n "$HUB" link set "port$letter" master br0 up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        echo "$ns node$letter $addr" >>"$STATE/nodes"
        echo "$addr slots=$SLOTS" >>"$STATE/hostfile"
    done
}

# run_on NODE CMD...: CMD in NODE's network namespace and a UTS namespace named after it, so
# that gethostname() there says nodeB. exec all the way down: a signal to this process (from
# timeout, or from mpirun ending its agents) reaches CMD itself.
run_on() {
    node_of "$1"
    shift
    exec ip netns exec "$node_ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$node_host" "$@"
}

# The rsh agent. Open MPI calls it as it would call ssh: options, the host, then the command as
# words that the remote shell joins into one line. Like ssh, the command starts with a login's
# environment (HOME, PATH, USER), not the caller's, so what the ranks need must travel by
# mpirun -x or env, as on real machines.
agent() {
    while [ $# -gt 0 ]; do
        case $1 in
            -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;; # ssh options that take a value
            -*) shift ;;
            *) break ;;
        esac
    done
    [ $# -ge 2 ] || die "agent: usage: agent [options] HOST COMMAND..."
    local host=$1
    shift
    run_on "$host" env -i HOME="${HOME:-/root}" PATH="$PATH" USER="$(id -un)" LOGNAME="$(id -un)" \
        SHELL=/bin/sh sh -c "$*"
}

# Open MPI settings for the namespaces: TCP between nodes, on the namespaces' subnet only (the
# daemons' out-of-band channel too), shared memory within a node. No binding: every node's
# daemon would bind its ranks to the same cores of this one machine (measured: 100 steps of the
# example trainer at np=4 took 11.5 s bound to cores, 3.9 s unbound).
launch() {
    local first prog=$1
    shift
    first=$(nodes | awk 'NR == 1 { print $1 }')
    run_on "$first" "$prog" --hostfile "$STATE/hostfile" --mca plm_rsh_agent "$SELF agent" \
        --mca btl self,vader,tcp --mca btl_tcp_if_include $SUBNET.0/24 --mca oob_tcp_if_include $SUBNET.0/24 \
        --bind-to none "$@"
}

# cut NODE...: the switch port of each NODE stops forwarding, as when a cable or a switch fails:
# both ends keep their carrier and addresses, packets leave and are never answered, so nothing
# fails at once. heal: every port forwards again.
cut() {
    [ $# -gt 0 ] || die "cut: name the nodes to cut off (e.g. nodeB)"
    local node
    for node in "$@"; do
        node_of "$node"
        ip netns exec "$HUB" bridge link set dev "port${node_ns#"$PREFIX"}" state 0 # disabled
    done
}

heal() {
    local ns host addr
    while read -r ns host addr; do
        ip netns exec "$HUB" bridge link set dev "port${ns#"$PREFIX"}" state 3 # forwarding
    done < <(nodes)
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
    can) can "$@" ;;
    up) up "$@" ;;
    down) down ;;
    exec) [ $# -ge 2 ] || die "exec: usage: exec NODE CMD..."; run_on "$@" ;;
    agent) agent "$@" ;;
    mpirun) launch mpirun "$@" ;;
    launch) [ $# -ge 1 ] || die "launch: usage: launch PROG ARGS..."; launch "$@" ;;
    cut) cut "$@" ;;
    heal) heal ;;
    *) sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
