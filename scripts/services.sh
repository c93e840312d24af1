#!/usr/bin/env bash
# services.sh — start or stop the local data tier holdfast runs against:
# redis-server, MariaDB and an SQS-API server (goaws), all on loopback.
#
#   scripts/services.sh install          install what is missing (apt, go tool)
#   scripts/services.sh start DIR        start everything with data under DIR;
#                                        writes DIR/env (shell exports) and DIR/pids
#   scripts/services.sh stop DIR         stop what `start DIR` started, by PID
#
# Ports are free ports chosen at start unless HOLDFAST_REDIS_PORT, HOLDFAST_DB_PORT
# or HOLDFAST_SQS_PORT are set. Everything binds to 127.0.0.1 only.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

log() { printf 'services: %s\n' "$*" >&2; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_for() { # wait_for DESC CMD... — poll until CMD succeeds (max ~60 s: a busy
  # machine can take a while to start MariaDB; seen once past 15 s)
  local desc=$1; shift
  for _ in $(seq 1 1200); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  log "$desc did not become ready"; return 1
}

install() {
  local need=()
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null || need+=(mariadb-server)
  command -v mariadb >/dev/null || need+=(mariadb-client)
  command -v python3 >/dev/null || need+=(python3)
  command -v curl >/dev/null || need+=(curl ca-certificates)
  if ((${#need[@]})); then
    log "installing ${need[*]} with apt"
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ ! -x "$root/bin/goaws" ]; then
    log "building the SQS-API server (goaws, pinned in go.mod as a tool)"
    (cd "$root" && go build -o bin/goaws github.com/Admiral-Piett/goaws/app/cmd)
  fi
}

start() {
  local dir=$1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/pids" ]; then stop "$dir"; fi
  : > "$dir/pids"

  local rport=${HOLDFAST_REDIS_PORT:-$(free_port)}
  local dport=${HOLDFAST_DB_PORT:-$(free_port)}
  local sport=${HOLDFAST_SQS_PORT:-$(free_port)}

  # Redis: no persistence; holds must never be evicted (as on ElastiCache with noeviction).
  mkdir -p "$dir/redis"
  setsid redis-server --bind 127.0.0.1 --port "$rport" --dir "$dir/redis" --save '' --appendonly no \
    --maxmemory-policy noeviction --daemonize no >"$dir/redis.log" 2>&1 &
  echo "redis $!" >> "$dir/pids"
  wait_for "redis-server" redis-cli -p "$rport" ping

  # MariaDB: private datadir, strict SQL mode like MySQL 8.
  if [ ! -d "$dir/mysql/mysql" ]; then
    mkdir -p "$dir/mysql"
    mariadb-install-db --no-defaults --basedir=/usr --datadir="$dir/mysql" --user=root \
      --auth-root-authentication-method=normal --skip-test-db >"$dir/mariadb-install.log" 2>&1
  fi
  # Tests trade durability for speed; HOLDFAST_DB_DURABLE=1 (make bench) runs
  # MariaDB as production runs MySQL: flush and binlog sync at every commit.
  local durability="--innodb-flush-log-at-trx-commit=2 --skip-log-bin"
  if [ "${HOLDFAST_DB_DURABLE:-0}" = 1 ]; then
    durability="--innodb-flush-log-at-trx-commit=1 --log-bin=$dir/mysql/binlog --sync-binlog=1 --server-id=1"
  fi
  setsid mariadbd --no-defaults --user=root --datadir="$dir/mysql" --socket="$dir/mysql.sock" \
    --port="$dport" --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$dir/mysql.pid" \
    --max-connections=500 $durability \
    --sql-mode=ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION \
    >"$dir/mariadb.log" 2>&1 &
  echo "mariadb $!" >> "$dir/pids"
  wait_for "mariadbd" mariadb-admin --no-defaults -uroot --socket="$dir/mysql.sock" ping ||
    { tail -20 "$dir/mariadb.log" >&2; return 1; }

  # A local, loopback-only user without a password: nothing secret exists, so
  # nothing can leak into the repo, env files or logs.
  mariadb --no-defaults -uroot --socket="$dir/mysql.sock" <<SQL
CREATE DATABASE IF NOT EXISTS holdfast CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
CREATE USER IF NOT EXISTS 'holdfast'@'127.0.0.1';
ALTER USER 'holdfast'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON \`holdfast%\`.* TO 'holdfast'@'127.0.0.1' WITH GRANT OPTION;
-- As Aurora's master user may: the migrate function creates the functions'
-- least-privilege user (make invoke FN=migrate, and its test).
GRANT CREATE USER ON *.* TO 'holdfast'@'127.0.0.1';
GRANT SELECT ON mysql.* TO 'holdfast'@'127.0.0.1';
SQL

  # SQS-API server. Create queues before traffic: goaws is not safe otherwise.
  cat > "$dir/goaws.yaml" <<YAML
Local:
  Host: 127.0.0.1
  Port: $sport
  Region: us-east-1
  AccountId: "100010001000"
  LogToFile: false
  EnableDuplicates: false
  QueueAttributeDefaults:
    VisibilityTimeout: 30
    ReceiveMessageWaitTimeSeconds: 0
    MaximumMessageSize: 262144
  Queues: []   # created from template.yaml by cmd/dev, or per test
YAML
  setsid "$root/bin/goaws" -config "$dir/goaws.yaml" -loglevel error >"$dir/goaws.log" 2>&1 &
  echo "goaws $!" >> "$dir/pids"
  wait_for "goaws" curl -sf "http://127.0.0.1:$sport/health"

  # The key of reservation ids derived from an Idempotency-Key. Local data
  # only, and the same on every machine so that events/ (sam local parity)
  # name the ids make dev derives; in AWS it is a generated Secrets Manager
  # secret (IdSecret in template.yaml).
  [ -f "$dir/id-secret" ] || printf '%s\n' 'holdfast-local-dev-id-key (not a secret; AWS uses Secrets Manager)' > "$dir/id-secret"

  cat > "$dir/env" <<ENV
export HOLDFAST_REDIS_ADDR=127.0.0.1:$rport
export HOLDFAST_DB_DSN='holdfast@tcp(127.0.0.1:$dport)/holdfast?parseTime=true&interpolateParams=true'
export HOLDFAST_DB_ADMIN_DSN='holdfast@tcp(127.0.0.1:$dport)/?parseTime=true&interpolateParams=true'
export HOLDFAST_AWS_ENDPOINT=http://127.0.0.1:$sport
export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$sport
export HOLDFAST_QUEUE_URL=http://127.0.0.1:$sport/100010001000/holdfast-reservations
export HOLDFAST_DLQ_URL=http://127.0.0.1:$sport/100010001000/holdfast-reservations-dlq
export HOLDFAST_EVENTS_QUEUE_URL=http://127.0.0.1:$sport/100010001000/holdfast-events
export HOLDFAST_ID_SECRET_FILE=$dir/id-secret
export AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=local
export AWS_SECRET_ACCESS_KEY=local
ENV
  log "redis-server  127.0.0.1:$rport"
  log "mariadb       127.0.0.1:$dport (database holdfast, user holdfast)"
  log "sqs (goaws)   http://127.0.0.1:$sport"
  log "settings in   $dir/env"
}

alive() { # a zombie (exited, not yet reaped by its new parent) counts as gone
  local st
  [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ -n "$st" && "$st" != Z ]]
}

stop() {
  local dir=$1
  [ -f "$dir/pids" ] || { log "nothing started in $dir"; return 0; }
  while read -r name pid; do
    if alive "$pid"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 200); do alive "$pid" || break; sleep 0.05; done
      if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
      log "stopped $name (pid $pid)"
    else
      log "$name (pid $pid) had already exited"
    fi
  done < "$dir/pids"
  rm -f "$dir/pids"
}

case "${1:-}" in
  install) install ;;
  start) [ $# -eq 2 ] || { echo "usage: $0 start DIR" >&2; exit 2; }; install; start "$2" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
