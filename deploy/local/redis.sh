#!/usr/bin/env bash
# Start or stop a private redis-server on 127.0.0.1 (skipped when REDIS_URL is given).
# Usage: redis.sh start|stop|status
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PORT="${MEMLANE_REDIS_PORT:-36379}"
RUN="${MEMLANE_RUN_DIR:-$ROOT/.run}/redis"
PIDFILE="$RUN/redis.pid"

log() { printf '[redis] %s\n' "$*" >&2; }
running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_installed() {
  command -v redis-server >/dev/null && return
  log "redis-server is missing; installing Debian's package"
  if [[ $(id -u) -ne 0 ]]; then log "run as root or install redis-server yourself"; exit 1; fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  # Debian starts its own service on 6379; ours is separate, so leave theirs off.
  (service redis-server stop || true) >/dev/null 2>&1
}

start() {
  if [[ -n "${REDIS_URL:-}" ]]; then log "REDIS_URL is set; not starting a local redis"; return; fi
  if running; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return; fi
  if port_open "$PORT"; then
    log "port $PORT on 127.0.0.1 is taken by another process; set MEMLANE_REDIS_PORT to a free port"
    exit 1
  fi
  ensure_installed
  mkdir -p "$RUN"
  redis-server --bind 127.0.0.1 --port "$PORT" --dir "$RUN" --pidfile "$PIDFILE" \
    --daemonize yes --logfile "$RUN/redis.log" --appendonly yes --save "" >/dev/null
  # A large append-only file takes a while to load; Redis answers LOADING meanwhile.
  local said_loading=""
  for _ in $(seq 1 600); do
    local reply; reply="$(redis-cli -p "$PORT" ping 2>&1 || true)"
    if [[ "$reply" == PONG ]]; then
      log "ready on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"; return
    fi
    if [[ "$reply" == LOADING* && -z "$said_loading" ]]; then
      log "loading its data set from $RUN; waiting"; said_loading=1
    fi
    if [[ -f "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then break; fi
    sleep 0.2
  done
  log "redis did not answer PING; see $RUN/redis.log"; exit 1
}

stop() {
  if ! running; then log "not running"; rm -f "$PIDFILE"; return; fi
  local pid; pid="$(cat "$PIDFILE")"
  log "stopping pid $pid"
  kill "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  install) ensure_installed ;;  # redis-cluster.sh uses this too
  status) if running; then echo "redis running pid $(cat "$PIDFILE") port $PORT"; else echo "redis stopped"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status|install" >&2; exit 2 ;;
esac
