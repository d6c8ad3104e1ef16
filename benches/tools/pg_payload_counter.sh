#!/bin/bash
# Server time and throughput of `wr_admit` with a 30 KB payload under three designs of the
# payload byte counter (docs::postgres, "Payloads"): the one counter row this backend uses, 16
# striped rows summed for the budget check (not exact), and no counter at all, beside an admit
# without a payload; 1, 8 and 64 clients, interleaved, twice. pgbench -M prepared, 6 s a row;
# server time is pg_stat_statements' mean_exec_time (the commit left out). pgbench cannot bind
# bytea: the body (30 KB of random bytes) is read in the same statement from a one-row table
# stored uncompressed.
#
# Usage: benches/tools/pg_payload_counter.sh (from the repository; initdb, pg_ctl, postgres in
# WORKER_REGISTRY_POSTGRES_BIN or on PATH; pgbench and psql on PATH). Starts and stops a
# throwaway cluster in a temporary directory on port 55435 (run as the `postgres` user when
# root), fsync and synchronous_commit on.
set -euo pipefail
bin="${WORKER_REGISTRY_POSTGRES_BIN:-$(dirname "$(command -v initdb)")}"
src="$(cd "$(dirname "$0")/../../src/postgres" && pwd)"
dir="$(mktemp -d)"
port=55435
as() { if [ "$(id -u)" = 0 ]; then chown -R postgres "$dir"; runuser -u postgres -- "$@"; else "$@"; fi; }
as "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
as "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start -o "-p $port -k $dir \
  -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements \
  -c pg_stat_statements.track=top -c max_connections=200" >/dev/null
trap 'as "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null; rm -rf "$dir"' EXIT
P=(psql -h 127.0.0.1 -p $port -U postgres -At -q -v ON_ERROR_STOP=1)
cat "$src"/migrations/*.sql "$src/functions.sql" | "${P[@]}" -1 2>/dev/null
budget=1099511627776
"${P[@]}" <<SQL
CREATE EXTENSION pg_stat_statements;
SELECT wr_open('bench');
CREATE SEQUENCE bench_seq;
CREATE TABLE bench_body (body bytea);
ALTER TABLE bench_body ALTER body SET STORAGE EXTERNAL;
INSERT INTO bench_body SELECT decode(string_agg(lpad(to_hex((random() * 255)::int), 2, '0'), ''), 'hex')
  FROM generate_series(1, 30720);
SELECT count(*) FROM (SELECT wr_admit(1, 'bench/repo', i, 'warm-' || i, 10000, 3600000, 3600000,
  0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, $budget) FROM generate_series(1, 64) i) x;
-- The striped variant's counter.
CREATE TABLE bench_stripes (registry bigint, stripe smallint, held bigint NOT NULL DEFAULT 0,
  bytes bigint NOT NULL DEFAULT 0, PRIMARY KEY (registry, stripe));
INSERT INTO bench_stripes SELECT 1, s FROM generate_series(0, 15) s;
SQL
# The variants of wr_payload_put: the file's, without its counter update, and striped.
exact="$(sed -n '/^CREATE OR REPLACE FUNCTION wr_payload_put(/,/^\$\$;/p' "$src/functions.sql")"
nocounter="$(printf '%s\n' "$exact" | sed '/^    UPDATE wr_payload_budget$/,/^    END IF;$/d')"
striped="$(printf '%s\n' "$nocounter" | sed 's/^END$/    UPDATE bench_stripes SET held = held + 1, bytes = bytes + p_size WHERE registry = p_reg AND stripe = (SELECT floor(random() * 16)::smallint);\nEND/')"
plain="SELECT o_outcome FROM wr_admit(1, 'bench/repo', :t, 'p' || nextval('bench_seq'), 10000, \
3600000, 3600000, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, $budget);"
payload="SELECT o_outcome FROM wr_admit(1, 'bench/repo', :t, 'y' || nextval('bench_seq'), 10000, \
3600000, 3600000, 0, 0, 0, 'pull_request', 'opened', 'application/json', '{x-github-hook-id,123}', \
(SELECT body FROM bench_body), 30772, $budget);"
stripedq="SELECT o_outcome, (SELECT sum(bytes) FROM bench_stripes WHERE registry = 1) FROM wr_admit(1, \
'bench/repo', :t, 'z' || nextval('bench_seq'), 10000, 3600000, 3600000, 0, 0, 0, 'pull_request', \
'opened', 'application/json', '{x-github-hook-id,123}', (SELECT body FROM bench_body), 30772, $budget);"
run() { # name clients statement
  printf '\\set t random(1, 64)\n%s\n' "$3" > "$dir/script.sql"
  "${P[@]}" -c "SELECT pg_stat_statements_reset()" >/dev/null
  tps="$(pgbench -h 127.0.0.1 -p $port -U postgres -n -M prepared -T 6 -c "$2" -j 2 \
    -f "$dir/script.sql" postgres 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')"
  us="$("${P[@]}" -c "SELECT round(mean_exec_time::numeric * 1000) FROM pg_stat_statements \
    WHERE query LIKE '%wr_admit%' ORDER BY calls DESC LIMIT 1")"
  printf '| %s | %s | %.0f | %s |\n' "$1" "$2" "$tps" "$us"
}
echo "| admit | in flight | calls/s | server µs (mean) |"
echo "|---|---:|---:|---:|"
for rep in 1 2; do
  for c in 1 8 64; do
    run "no payload" "$c" "$plain"
    "${P[@]}" -c "$exact" && run "30 KB, one counter row" "$c" "$payload"
    "${P[@]}" -c "$striped" && run "30 KB, 16 striped rows" "$c" "$stripedq"
    "${P[@]}" -c "$nocounter" && run "30 KB, no counter" "$c" "$payload"
  done
done
