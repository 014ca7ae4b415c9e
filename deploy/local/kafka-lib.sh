# Shared by kafka.sh (one broker) and kafka-cluster.sh (three): sourced, not run.
# The caller sets HERE (this directory) and TAG (its log prefix) first.
# shellcheck shell=bash
CACHE="$HERE/.cache/kafka"
LIBS="$CACHE/libs"

log() { printf '[%s] %s\n' "${TAG:-kafka}" "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

fetch_jars() {
  [[ -f "$LIBS/.complete" ]] && return
  log "fetching broker jars with mvn into $LIBS (once)"
  mkdir -p "$LIBS"
  mvn -q -B -f "$HERE/kafka-pom.xml" dependency:copy-dependencies -DoutputDirectory="$LIBS"
  touch "$LIBS/.complete"
}

# kafka_ready BOOTSTRAP [BROKERS]: a metadata request answers (from every listed address, each
# seeing at least BROKERS live brokers when given), not merely that the port accepts.
kafka_ready() { "${PYTHON:-python3}" "$HERE/kafka_ready.py" "$@" 2>/dev/null; }
