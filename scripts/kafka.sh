#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft: broker + controller in one JVM) on 127.0.0.1, from the
# official jars that Maven resolves from services/kafka/pom.xml.
#
#   scripts/kafka.sh start | stop | status
#
# Settings (environment):
#   TURNLOG_KAFKA_PORT             client port (default 9092); the controller uses port + 1
#   TURNLOG_KAFKA_DIR              data, config and log dir (default ./.services/kafka)
#   TURNLOG_KAFKA_HEAP             JVM heap (default 512m; this machine has 2 cores shared with tests)
#   TURNLOG_KAFKA_LIBS             where the broker's jars are (default DIR/libs; a second broker,
#                                  as tests/test_health.py starts, shares the first one's)
# On success `start` prints the bootstrap address, e.g. TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PORT="${TURNLOG_KAFKA_PORT:-9092}"
CPORT=$((PORT + 1))
DIR="${TURNLOG_KAFKA_DIR:-$ROOT/.services/kafka}"
HEAP="${TURNLOG_KAFKA_HEAP:-512m}"
LIBS="${TURNLOG_KAFKA_LIBS:-$DIR/libs}"
PIDFILE="$DIR/broker.pid"
LOG="$DIR/broker.log"
POM="$ROOT/services/kafka/pom.xml"

die() { echo "kafka.sh: $*" >&2; exit 1; }

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

accepting() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

fetch_jars() {
    local stamp="$LIBS/.pom-$(sha256sum "$POM" | cut -c1-16)"
    [ -f "$stamp" ] && return 0
    command -v mvn >/dev/null || die "Maven is needed to fetch the Kafka jars (Debian: apt-get install maven)"
    command -v java >/dev/null || die "Java 17+ is needed to run Kafka (Debian: apt-get install openjdk-17-jre-headless)"
    echo "fetching the Apache Kafka jars with Maven into $LIBS ..." >&2
    rm -rf "$LIBS" && mkdir -p "$LIBS"
    if ! mvn -q -B -f "$POM" dependency:copy-dependencies -DoutputDirectory="$LIBS" -DincludeScope=runtime \
            > "$DIR/maven.log" 2>&1; then
        tail -n 30 "$DIR/maven.log" >&2
        die "Maven could not resolve services/kafka/pom.xml (full log: $DIR/maven.log); check access to Maven Central"
    fi
    touch "$stamp"
}

write_config() {
    cat > "$DIR/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
CONF
    cat > "$DIR/log4j2.properties" <<CONF
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = warn
logger.kafka.controller.name = kafka.controller
logger.kafka.controller.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
CONF
}

java_cmd() {
    exec java -Xms128m "-Xmx$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        "-Dlog4j2.configurationFile=$DIR/log4j2.properties" -cp "$LIBS/*" "$@"
}

start() {
    if running; then
        echo "Kafka is already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
        echo "TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:$PORT"
        return 0
    fi
    accepting && die "port $PORT is taken by another process; set TURNLOG_KAFKA_PORT to a free port"
    mkdir -p "$DIR"
    fetch_jars
    write_config
    if [ ! -f "$DIR/data/meta.properties" ]; then
        local cluster
        cluster="$( (java_cmd kafka.tools.StorageTool random-uuid) 2>>"$LOG" | tail -n 1)"
        if ! (java_cmd kafka.tools.StorageTool format -t "$cluster" -c "$DIR/server.properties") \
                >> "$LOG" 2>&1; then
            tail -n 20 "$LOG" >&2
            die "formatting the storage in $DIR/data failed (log: $LOG); remove $DIR/data and retry"
        fi
    fi
    (java_cmd kafka.Kafka "$DIR/server.properties" >> "$LOG" 2>&1 < /dev/null) &
    echo $! > "$PIDFILE"
    for _ in $(seq 1 240); do
        if accepting && grep -q "started (kafka.server.KafkaRaftServer)\|Kafka Server started" "$LOG" 2>/dev/null; then
            echo "Kafka is up on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
            echo "TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:$PORT"
            return 0
        fi
        running || break
        sleep 0.5
    done
    tail -n 30 "$LOG" >&2
    stop >/dev/null 2>&1 || true
    die "Kafka did not accept connections on 127.0.0.1:$PORT within 120 s (log: $LOG). Check that Java 17 \
runs, that the port is free, and that $DIR/data is not from another cluster (remove it to start afresh)."
}

stop() {
    if ! running; then
        echo "Kafka is not running"
        rm -f "$PIDFILE"
        return 0
    fi
    local pid
    pid="$(cat "$PIDFILE")"
    kill "$pid"
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; echo "Kafka stopped"; return 0; }
        sleep 0.5
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    echo "Kafka did not stop within 30 s and was killed"
}

status() {
    if running && accepting; then
        echo "Kafka is running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
    elif running; then
        echo "Kafka is starting or stuck (pid $(cat "$PIDFILE")); log: $LOG"
        return 1
    else
        echo "Kafka is not running"
        return 3
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: scripts/kafka.sh start|stop|status" ;;
esac
