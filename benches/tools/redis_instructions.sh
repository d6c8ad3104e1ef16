#!/bin/bash
# Server instructions per decision, deterministic where the wall-clock µs of `benches/redis.rs`
# move by 10-30 % between runs on a shared machine (docs::redis, "Per-decision cost").
#
# Usage: benches/tools/redis_instructions.sh <redis bench binary> [port]
#   the binary from `cargo bench --features postgres,redis,testkit --bench redis --no-run`
#   (target/release/deps/redis-<hash>); needs redis-server, redis-cli and valgrind.
#
# It starts a throwaway redis-server under `valgrind --tool=callgrind` on the port (6411), runs the
# bench binary against it once with 200 calls a row (which loads the binary's function library),
# then makes, on a registry of its own, 256 targets each with a started worker and measures four
# decisions, 2 048 calls each, sent one at a time by redis-cli (so the figures include reading
# each command and writing its reply): sticky admits (8 new deliveries per target, so a worker
# holds at most 9 claims in flight, as in production), admits that create a worker (2 048 new
# targets), duplicates of claims in flight, and heartbeats of started workers; then the sticky
# and the creating admit again, each carrying a 30 000-byte payload as `admit_with` sends it
# (size, budget, and the encoded payload: 30 056 bytes for the bench's `pull_request`), on 256
# targets of their own (`sticky_30k`, `creating_30k`), and the no-op floor with the same
# arguments (`floor_noop_30k`: what receiving them costs). Each figure is the
# whole server's instructions between `callgrind_control -z` and `-d`, divided by 2 048; the
# server's own timers add about +-1 500 a call between runs.
#
# Then the floors (benches/RESULTS.md, "How far from the floor"): the same server loads
# benches/tools/redis_floor.lua, functions that make exactly a sticky admit's 8 commands and a
# creating admit's 13 on keys of the same shapes (under a prefix of their own, seeded as the
# registry's are) and decide nothing, and a no-op FCALL with the admit's arguments. Each decision's
# line gives the part above its floor: what its Lua logic costs, as opposed to its commands.
set -eu
bin=$1
P=${2:-6411}
R="redis-cli -p $P"
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
  redis-server --port "$P" --save '' --appendonly no > "$dir/valgrind.log" 2>&1 &
for _ in $(seq 1 100); do $R ping > /dev/null 2>&1 && break; sleep 0.3; done
WORKER_REGISTRY_REDIS_URL=redis://127.0.0.1:$P WR_REDIS_BENCH_CALLS=200 "$bin" --bench zzz_none \
  > "$dir/bench.log" 2>&1
NS=$($R function list | grep -m1 -o 'wr_[0-9a-f]\{16\}')
K='{cg}:'
LIM="100000 30000 30000 600000 3600000" # max_workers timeout grace retention max_in_flight (ms)
# admit's own arguments (anything after them is a payload: size, budget, encoding).
LIMA="100000 30000 30000 600000"
BODY=$(head -c 30056 /dev/zero | tr '\0' x)
PAY="30039 1000000000000 $BODY"
T=256
for k in $(seq 1 $T); do echo "FCALL ${NS}_admit 1 $K $K rep o/s#$k d0 $LIMA"; done | $R \
  | grep -o 'worker	[0-9]*' | awk '{print $2}' > "$dir/workers"
for w in $(cat "$dir/workers"); do
  echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"
  echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"
done | $R > /dev/null
for j in $(seq 1 8); do for k in $(seq 1 $T); do
  echo "FCALL ${NS}_admit 1 $K $K rep o/s#$k d$j $LIMA"
done; done > "$dir/sticky"
for k in $(seq 1 2048); do echo "FCALL ${NS}_admit 1 $K $K rep o/n#$k d $LIMA"; done > "$dir/creating"
# The payload rows' targets, each with a started worker, as the sticky row's.
for k in $(seq 1 $T); do echo "FCALL ${NS}_admit 1 $K $K rep o/q#$k d0 $LIMA"; done | $R \
  | grep -o 'worker	[0-9]*' | awk '{print $2}' > "$dir/qworkers"
for w in $(cat "$dir/qworkers"); do
  echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"
  echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"
done | $R > /dev/null
for j in $(seq 1 8); do for k in $(seq 1 $T); do
  echo "FCALL ${NS}_admit 1 $K $K rep o/q#$k d$j $LIMA $PAY"
done; done > "$dir/sticky_30k"
for k in $(seq 1 2048); do echo "FCALL ${NS}_admit 1 $K $K rep o/m#$k d $LIMA $PAY"; done \
  > "$dir/creating_30k"
for k in $(seq 1 $T); do for j in $(seq 1 8); do
  echo "FCALL ${NS}_admit 1 $K $K rep o/s#$k d$j $LIMA"
done; done > "$dir/duplicate"
for _ in $(seq 1 8); do for w in $(cat "$dir/workers"); do
  echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"
done; done > "$dir/heartbeat"
# The floors' keys: one worker per target, as the registry's (a creating floor call each).
$R -x FUNCTION LOAD REPLACE < "$(dirname "$0")/redis_floor.lua" > /dev/null
F='{fl}:'
for k in $(seq 1 $T); do echo "FCALL wr_floor_creating 1 $F $F rep o/s#$k d0 $LIM"; done | $R > /dev/null
for j in $(seq 1 8); do for k in $(seq 1 $T); do
  echo "FCALL wr_floor_sticky 1 $F $F rep o/s#$k d$j $LIM"
done; done > "$dir/floor_sticky"
for k in $(seq 1 2048); do echo "FCALL wr_floor_creating 1 $F $F rep o/n#$k d $LIM"; done \
  > "$dir/floor_creating"
for k in $(seq 1 2048); do echo "FCALL wr_floor_noop 1 $F $F rep o/s#1 d$k $LIM"; done \
  > "$dir/floor_noop"
# The no-op with the payload's arguments: what receiving 30 KB costs, before anything is stored.
for k in $(seq 1 2048); do echo "FCALL wr_floor_noop 1 $F $F rep o/s#1 d$k $LIMA $PAY"; done \
  > "$dir/floor_noop_30k"
n=0
declare -A per
for what in sticky creating duplicate heartbeat sticky_30k creating_30k floor_sticky floor_creating \
  floor_noop floor_noop_30k; do
  callgrind_control -z > /dev/null 2>&1
  $R < "$dir/$what" > "$dir/$what.out"
  callgrind_control -d > /dev/null 2>&1
  n=$((n + 1))
  for _ in $(seq 1 50); do [ -s "$dir/cg.out.$n" ] && break; sleep 0.2; done
  sleep 1
  total=$(grep -m1 -E '^(summary|totals):' "$dir/cg.out.$n" | awk '{print $2}')
  answers=$(cut -f1-2 "$dir/$what.out" | sort | uniq -c | sort -rn | head -1 | xargs)
  per[$what]=$((total / 2048))
  echo "$what: ${per[$what]} instructions per call (answers: $answers)"
done
for what in sticky creating; do
  echo "$what with a 30 KB payload: $((per[${what}_30k] - per[$what])) instructions more per call"
done
echo "receiving the payload's arguments alone (a no-op FCALL): $((per[floor_noop_30k] - per[floor_noop]))" \
  "instructions more per call"
for what in sticky creating; do
  f=${per[floor_$what]}
  echo "$what above its floor: $((per[$what] - f)) instructions ($((100 * per[$what] / f)) % of the" \
    "floor; the floor's commands $((f - per[floor_noop])) above a no-op FCALL)"
done
$R shutdown nosave > /dev/null 2>&1 || true
wait
rm -rf "$dir"
