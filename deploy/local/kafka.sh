#!/usr/bin/env bash
# Start or stop a single-node KRaft Kafka broker on 127.0.0.1.
# Usage: kafka.sh start|stop|status
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PORT="${MEMLANE_KAFKA_PORT:-39092}"
CONTROLLER_PORT="${MEMLANE_KAFKA_CONTROLLER_PORT:-39093}"
TAG=kafka
# log, port_open, fetch_jars, kafka_ready and the jar cache (LIBS), shared with kafka-cluster.sh.
source "$HERE/kafka-lib.sh"
RUN="${MEMLANE_RUN_DIR:-$ROOT/.run}/kafka"
PIDFILE="$RUN/kafka.pid"
LOG="$RUN/server.log"

running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

write_config() {
  mkdir -p "$RUN/data"
  cat > "$RUN/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$RUN/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# A killed transactional worker's open transaction is aborted within a second of timing out
# (MEMLANE_TRANSACTION_TIMEOUT_MS), not up to ten (docs/operations/kafka-replication.md).
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=-1
log.segment.bytes=67108864
# A destroyed data key's segment is compacted within a second of becoming cleanable, and the
# file it leaves is unlinked a second later (defaults: 15 s and 60 s; docs/features/encryption-and-erasure.md).
log.cleaner.backoff.ms=1000
log.segment.delete.delay.ms=1000
# Sized for a 2-core machine: the defaults' 3 network and 8 I/O threads (and G1's
# concurrent GC threads) mostly contended with memlane's own processes for the cores.
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
CONF
}

java_cmd() {
  java -Xms256m -Xmx768m -XX:+UseParallelGC -XX:ParallelGCThreads=2 -Dkafka.logs.dir="$RUN" \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" \
    -cp "$LIBS/*" "$@"
}

start() {
  if running; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return; fi
  for p in "$PORT" "$CONTROLLER_PORT"; do
    if port_open "$p"; then
      log "port $p on 127.0.0.1 is taken by another process; set MEMLANE_KAFKA_PORT / MEMLANE_KAFKA_CONTROLLER_PORT to free ports"
      exit 1
    fi
  done
  fetch_jars
  write_config
  if [[ ! -f "$RUN/data/meta.properties" ]]; then
    log "formatting storage in $RUN/data"
    java_cmd kafka.tools.StorageTool format -t "memlane-local-cluster-01" -c "$RUN/server.properties" >"$RUN/format.log" 2>&1 \
      || { cat "$RUN/format.log" >&2; exit 1; }
  fi
  log "starting broker on 127.0.0.1:$PORT (log: $LOG)"
  # A session of its own: the broker outlives the shell job or test run that started it
  # (a job killed as a process group took the broker with it).
  setsid nohup java -Xms256m -Xmx768m -XX:+UseParallelGC -XX:ParallelGCThreads=2 -Dkafka.logs.dir="$RUN" \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" \
    -cp "$LIBS/*" kafka.Kafka "$RUN/server.properties" >"$RUN/stdout.log" 2>&1 &
  echo $! >"$PIDFILE"
  wait_ready
}

wait_ready() {
  # Ready means a metadata request answers, not merely that the port accepts.
  local deadline=$((SECONDS + 90))
  until kafka_ready "127.0.0.1:$PORT"; do
    if ! running; then log "broker exited; see $LOG and $RUN/stdout.log"; tail -20 "$RUN/stdout.log" >&2; exit 1; fi
    if (( SECONDS > deadline )); then log "broker not ready after 90 s; see $LOG"; exit 1; fi
    sleep 1
  done
  log "ready on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
}

stop() {
  if ! running; then log "not running"; rm -f "$PIDFILE"; return; fi
  local pid; pid="$(cat "$PIDFILE")"
  log "stopping pid $pid"
  kill "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "kafka running pid $(cat "$PIDFILE") port $PORT"; else echo "kafka stopped"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
