#!/usr/bin/env bash
# A 3-node KRaft Kafka cluster on 127.0.0.1 (each node broker and controller), replicated as a
# production cluster is: topics RF 3, min.insync.replicas 2 (docs/operations/kafka-replication.md).
# Usage: kafka-cluster.sh start|stop|status|kill N|restart N|leader|bootstrap|clean
#   start      starts every node not running, waits until all three are live brokers
#   stop       stops every node (SIGTERM, SIGKILL after MEMLANE_KAFKA_CLUSTER_STOP_S)
#   kill N     kill -9 node N (1-3), as a crash would
#   restart N  stops node N if it runs, starts it, waits until the cluster has three brokers again
#   leader     the node id of the active controller (the KRaft quorum's leader)
#   bootstrap  the bootstrap servers (for MEMLANE_KAFKA_BOOTSTRAP)
#   clean      stop, then delete the run directory (every topic and the cluster's metadata)
# Node N listens on MEMLANE_KAFKA_CLUSTER_PORT + 2(N-1) (clients) and the port after it
# (controllers): 29192/29193, 29194/29195, 29196/29197 by default, below the ephemeral range
# (an outgoing connection once held 39194 there). It runs beside the single broker of kafka.sh
# (39092) and shares its jars.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TAG=kafka-cluster
source "$HERE/kafka-lib.sh"
BASE_PORT="${MEMLANE_KAFKA_CLUSTER_PORT:-29192}"
RUN="${MEMLANE_KAFKA_CLUSTER_DIR:-${MEMLANE_RUN_DIR:-$ROOT/.run}/kafka-cluster}"
# Three JVMs share two cores with the single broker and memlane's processes: small heaps, one
# GC thread, and the client compiler only (the brokers here carry test loads, and C2's
# compilations were most of their start-up CPU).
HEAP="${MEMLANE_KAFKA_CLUSTER_HEAP:-256m}"
STOP_S="${MEMLANE_KAFKA_CLUSTER_STOP_S:-20}"
READY_S="${MEMLANE_KAFKA_CLUSTER_READY_S:-90}"
NODES=(1 2 3)
# Any valid base64 UUID; fixed, so a node's storage is formatted once and reused.
CLUSTER_ID="bWVtbGFuZS1jbHVzdGVyMw"

port() { echo $((BASE_PORT + 2 * ($1 - 1))); }
controller_port() { echo $((BASE_PORT + 2 * ($1 - 1) + 1)); }
node_dir() { echo "$RUN/node$1"; }
pidfile() { echo "$(node_dir "$1")/kafka.pid"; }
running() { local f; f="$(pidfile "$1")"; [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }
bootstrap() { local n out=(); for n in "${NODES[@]}"; do out+=("127.0.0.1:$(port "$n")"); done; (IFS=,; echo "${out[*]}"); }
voters() { local n out=(); for n in "${NODES[@]}"; do out+=("$n@127.0.0.1:$(controller_port "$n")"); done; (IFS=,; echo "${out[*]}"); }
check_node() { [[ "${1:-}" =~ ^[123]$ ]] || { echo "usage: $0 kill|restart N (N is 1, 2 or 3)" >&2; exit 2; }; }

write_config() {
  local n="$1" dir; dir="$(node_dir "$n")"
  mkdir -p "$dir/data"
  cat > "$dir/server.properties" <<CONF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(voters)
listeners=PLAINTEXT://127.0.0.1:$(port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(port "$n")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
# Every topic, the internal ones included, on all three nodes; a write is acknowledged (acks=all)
# once two of them have it, so one node can die without losing an acknowledged write or
# stopping writes (docs/operations/kafka-replication.md).
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.state.log.num.partitions=4
unclean.leader.election.enable=false
# A dead node is fenced (and dropped from every ISR) after 6 s without a heartbeat instead of
# 9 s: acks=all writes to the partitions it followed wait that long.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=-1
log.segment.bytes=67108864
# The log cleaner's dedupe buffer is on the heap (128 MB by default, which a 256 MB heap could
# not always give it at start); compacted topics here are small.
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=1
num.io.threads=2
num.replica.fetchers=1
background.threads=2
CONF
}

java_opts() {
  local dir="$1"
  echo "-Xms64m -Xmx$HEAP -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dkafka.logs.dir=$dir -Dlog4j2.configurationFile=$HERE/log4j2.properties"
}

format() {
  local n="$1" dir; dir="$(node_dir "$n")"
  [[ -f "$dir/data/meta.properties" ]] && return
  # shellcheck disable=SC2046
  java $(java_opts "$dir") -cp "$LIBS/*" kafka.tools.StorageTool format -t "$CLUSTER_ID" \
    -c "$dir/server.properties" >"$dir/format.log" 2>&1 || { log "formatting node $n failed:"; cat "$dir/format.log" >&2; return 1; }
}

start_node() {
  local n="$1" dir; dir="$(node_dir "$n")"
  for p in "$(port "$n")" "$(controller_port "$n")"; do
    if port_open "$p"; then
      log "port $p on 127.0.0.1 is taken by another process; set MEMLANE_KAFKA_CLUSTER_PORT to a free range"
      exit 1
    fi
  done
  # A session of its own: the node outlives the shell job or test run that started it (a test
  # killed as a process group would otherwise take the cluster with it).
  # shellcheck disable=SC2046
  setsid nohup java $(java_opts "$dir") -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
    >"$dir/stdout.log" 2>&1 &
  echo $! >"$(pidfile "$n")"
  log "node $n starting on 127.0.0.1:$(port "$n") (pid $!, log: $dir/server.log)"
}

check_alive() {
  local n
  for n in "${NODES[@]}"; do
    if ! running "$n"; then
      log "node $n exited; see $(node_dir "$n")/server.log"; tail -20 "$(node_dir "$n")/stdout.log" >&2; exit 1
    fi
  done
  if (( SECONDS > $1 )); then log "cluster not ready after $READY_S s; see $RUN/node*/server.log"; exit 1; fi
}

wait_ready() {
  local deadline=$((SECONDS + READY_S)) n
  # Ports first, in bash: each metadata probe starts a Python process, CPU the starting JVMs need.
  for n in "${NODES[@]}"; do
    until port_open "$(port "$n")"; do check_alive "$deadline"; sleep 0.2; done
  done
  until kafka_ready "$(bootstrap)" 3; do check_alive "$deadline"; sleep 0.5; done
  log "ready: $(bootstrap)"
}

start() {
  local n todo=()
  for n in "${NODES[@]}"; do running "$n" || todo+=("$n"); done
  if (( ${#todo[@]} == 0 )); then log "already running: $(bootstrap)"; return; fi
  fetch_jars
  # Formatting starts a JVM per node: in parallel, they take the time of one.
  local pids=()
  for n in "${todo[@]}"; do write_config "$n"; format "$n" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || exit 1; done
  for n in "${todo[@]}"; do start_node "$n"; done
  wait_ready
}

stop_nodes() {
  local n pids=()
  for n in "$@"; do
    if running "$n"; then pids+=("$(cat "$(pidfile "$n")")"); fi
  done
  if (( ${#pids[@]} == 0 )); then log "not running"; else
    # All at once: a node stopped alone moves its leaderships to the others first, which the
    # others, stopping next, would only undo.
    log "stopping pids ${pids[*]}"
    kill "${pids[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_S)) left
    while :; do
      left=(); for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
      (( ${#left[@]} == 0 )) && break
      if (( SECONDS >= deadline )); then log "SIGKILL to ${left[*]} after $STOP_S s"; kill -9 "${left[@]}" 2>/dev/null || true; break; fi
      sleep 0.2
    done
  fi
  for n in "$@"; do rm -f "$(pidfile "$n")"; done
}

kill_node() {
  local n="$1" pid
  check_node "$n"
  if ! running "$n"; then log "node $n is not running"; exit 1; fi
  pid="$(cat "$(pidfile "$n")")"
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$(pidfile "$n")"
  log "node $n (pid $pid) killed"
}

restart_node() {
  local n="$1"
  check_node "$n"
  stop_nodes "$n"
  fetch_jars
  write_config "$n"
  format "$n"
  start_node "$n"
  wait_ready
}

# The active controller, from the quorum state a running node keeps on disk (KRaft writes it on
# every election): the node with the highest leader epoch knows the latest leader. A leader that
# is not running is the state before an election still under way: asked again until one is.
leader() {
  local deadline=$((SECONDS + 30)) best epoch n f e id
  while :; do
    best=""; epoch=-1
    for n in "${NODES[@]}"; do
      running "$n" || continue
      f="$(node_dir "$n")/data/__cluster_metadata-0/quorum-state"
      [[ -f "$f" ]] || continue
      e="$(grep -o '"leaderEpoch":[0-9-]*' "$f" | cut -d: -f2)"
      id="$(grep -o '"leaderId":[0-9-]*' "$f" | cut -d: -f2)"
      if [[ -n "$e" && -n "$id" ]] && (( e > epoch )); then epoch="$e"; best="$id"; fi
    done
    if [[ -n "$best" && "$best" != "-1" ]] && running "$best"; then echo "$best"; return; fi
    if (( SECONDS > deadline )); then log "no running node knows a live leader"; exit 1; fi
    sleep 0.2
  done
}

status() {
  local n up=0
  for n in "${NODES[@]}"; do
    if running "$n"; then
      echo "node $n running pid $(cat "$(pidfile "$n")") port $(port "$n")"; up=$((up + 1))
    else
      echo "node $n stopped port $(port "$n")"
    fi
  done
  (( up > 0 ))
}

case "${1:-}" in
  start) start ;;
  stop) stop_nodes "${NODES[@]}" ;;
  status) status ;;
  kill) kill_node "${2:-}" ;;
  restart) restart_node "${2:-}" ;;
  leader) leader ;;
  bootstrap) bootstrap ;;
  clean) stop_nodes "${NODES[@]}"; rm -rf "$RUN"; log "removed $RUN" ;;
  *) sed -n '4,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
