#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on loopback for the tests.
#
#   eval "$(bash tests/pg/cluster.sh start DIR)"   # exports REFLEXR_PG_URL
#   bash tests/pg/cluster.sh restart DIR   # the fault test's server restart
#   bash tests/pg/cluster.sh stop DIR
#
# The cluster lives in DIR (made if missing) and listens on 127.0.0.1 only,
# on a free port; the tests' URL is printed as an export line. As root the
# server runs as the `postgres` user (initdb refuses root). Installs
# Debian's PostgreSQL when initdb is missing.
set -euo pipefail
cmd="${1:?start|stop}"
dir="${2:?a directory for the cluster}"

bindir=""
for d in /usr/lib/postgresql/*/bin; do
  if [ -x "$d/initdb" ]; then bindir="$d"; fi
done
if [ -z "$bindir" ] && [ "$cmd" = start ]; then
  echo "== installing PostgreSQL" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
  $SUDO apt-get update -qq >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ]; then bindir="$d"; fi
  done
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "$cmd" in
start)
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
  as_owner "$bindir/initdb" -D "$dir/data" -U reflexr --auth=trust -E UTF8 --no-sync >/dev/null
  # A port below Linux's ephemeral range (32768 and up by default), so no
  # client connection's own port can take it between the check and the
  # server's bind, and one nothing answers on. Three tries, each on a new
  # port, with the server's log shown when a start fails.
  started=""
  for try in 1 2 3; do
    port=""
    for _ in $(seq 1 50); do
      candidate=$((20000 + RANDOM % 12000))
      if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
        port="$candidate"
        break
      fi
    done
    if [ -z "$port" ]; then
      echo "no free port found" >&2
      exit 1
    fi
    if as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=on -c max_connections=200" \
      start >/dev/null; then
      started=1
      break
    fi
    echo "== the server did not start on port $port (try $try); the end of its log:" >&2
    tail -n 20 "$dir/server.log" >&2 || true
  done
  if [ -z "$started" ]; then
    exit 1
  fi
  as_owner "$bindir/createdb" -h 127.0.0.1 -p "$port" -U reflexr reflexr_test
  echo "$port" >"$dir/port"
  echo "export REFLEXR_PG_URL='host=127.0.0.1 port=$port user=reflexr dbname=reflexr_test'"
  ;;
restart)
  # Fast: every connection is cut, as a crash or a failover would.
  as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w restart >/dev/null
  ;;
stop)
  if [ -n "$bindir" ] && [ -d "$dir/data" ]; then
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
  fi
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
