#!/usr/bin/env bash
# Start or stop a private 3-master Redis Cluster on 127.0.0.1 (Debian's redis-server in
# cluster mode), for running the projection and API tests against a cluster.
# Usage: redis-cluster.sh start|stop|status
# Ports: MEMLANE_REDIS_CLUSTER_PORTS (default "16380 16381 16382"); each node's cluster bus
# is its port + 10000. Both stay below Linux's ephemeral range (32768-60999): a bus port in it
# was once held by one of the test run's own client connections when the cluster started.
# The data is throwaway: every start makes a fresh cluster, so a node's stale nodes.conf can
# never leave the cluster half-formed.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
read -r -a PORTS <<<"${MEMLANE_REDIS_CLUSTER_PORTS:-16380 16381 16382}"
RUN="${MEMLANE_RUN_DIR:-$ROOT/.run}/redis-cluster"

log() { printf '[redis-cluster] %s\n' "$*" >&2; }
pidfile() { echo "$RUN/$1/redis.pid"; }
node_running() { [[ -f "$(pidfile "$1")" ]] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
cluster_ok() { redis-cli -p "${PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

all_running() {
  local p
  for p in "${PORTS[@]}"; do node_running "$p" || return 1; done
}

start() {
  if all_running && cluster_ok; then log "already running on ports ${PORTS[*]}"; return; fi
  stop_nodes
  command -v redis-server >/dev/null || "$HERE/redis.sh" install
  local p
  for p in "${PORTS[@]}"; do
    if port_open "$p" || port_open "$((p + 10000))"; then
      log "port $p or $((p + 10000)) on 127.0.0.1 is taken; set MEMLANE_REDIS_CLUSTER_PORTS to free ports"
      exit 1
    fi
  done
  rm -rf "$RUN"
  for p in "${PORTS[@]}"; do
    mkdir -p "$RUN/$p"
    redis-server --bind 127.0.0.1 --port "$p" --dir "$RUN/$p" --pidfile "$(pidfile "$p")" \
      --daemonize yes --logfile "$RUN/$p/redis.log" --appendonly no --save "" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 >/dev/null
  done
  for p in "${PORTS[@]}"; do
    for _ in $(seq 1 100); do
      [[ "$(redis-cli -p "$p" ping 2>&1 || true)" == PONG ]] && break
      sleep 0.1
    done
    [[ "$(redis-cli -p "$p" ping 2>&1 || true)" == PONG ]] || { log "node $p did not answer PING; see $RUN/$p/redis.log"; exit 1; }
  done
  local nodes=()
  for p in "${PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$RUN/create.log" 2>&1 \
    || { log "cluster create failed; see $RUN/create.log"; exit 1; }
  # The nodes agree on the slot map over the cluster bus; every node must say ok.
  for _ in $(seq 1 300); do
    local ok=1
    for p in "${PORTS[@]}"; do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || ok=0
    done
    if [[ $ok == 1 ]]; then log "ready on 127.0.0.1 ports ${PORTS[*]}"; return; fi
    sleep 0.1
  done
  log "cluster_state did not become ok; see $RUN/*/redis.log"; exit 1
}

stop_nodes() {
  local p pid
  for p in "${PORTS[@]}"; do
    node_running "$p" || continue
    pid="$(cat "$(pidfile "$p")")"
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$(pidfile "$p")"
  done
}

stop() {
  if ! [[ -d "$RUN" ]]; then log "not running"; return; fi
  log "stopping ports ${PORTS[*]}"
  stop_nodes
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    if all_running && cluster_ok; then echo "redis cluster running ports ${PORTS[*]}"; else echo "redis cluster stopped"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
