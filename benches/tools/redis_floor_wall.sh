#!/bin/bash
# Wall-clock server time per call (`INFO commandstats`, FCALL usec_per_call) of a sticky admit and
# a creating admit beside their floors (benches/tools/redis_floor.lua) and a no-op FCALL, on a
# throwaway plain redis-server, 5 120 calls a row sent with `redis-cli --pipe`, alternated three
# times (benches/RESULTS.md, "How far from the floor").
#
# Usage: benches/tools/redis_floor_wall.sh <redis bench binary> (as redis_instructions.sh)

set -eu
bin=$1; P=${2:-6413}; R="redis-cli -p $P"; dir=$(mktemp -d)
redis-server --port $P --save '' --appendonly no --daemonize yes > /dev/null; sleep 0.5
WORKER_REGISTRY_REDIS_URL=redis://127.0.0.1:$P WR_REDIS_BENCH_CALLS=200 "$bin" --bench zzz_none > /dev/null 2>&1
$R -x FUNCTION LOAD REPLACE < "$(dirname "$0")/redis_floor.lua" > /dev/null
NS=$($R function list | grep -m1 -o 'wr_[0-9a-f]\{16\}')
K='{wc}:'; F='{fl}:'; LIM="1000000 30000 30000 600000 3600000"
for k in $(seq 0 255); do t=$(printf 'o/s#%012d' $k); echo "FCALL ${NS}_admit 1 $K $K rep $t d0 $LIM"; done | $R | grep -o 'worker	[0-9]*' | awk '{print $2}' > "$dir/workers"
for w in $(cat "$dir/workers"); do echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"; echo "FCALL ${NS}_heartbeat 1 $K $K rep $w 30000"; done | $R > /dev/null
for k in $(seq 0 255); do t=$(printf 'o/s#%012d' $k); echo "FCALL wr_floor_creating 1 $F $F rep $t d0 $LIM"; done | $R > /dev/null
run() { # file
  $R config resetstat > /dev/null
  $R --pipe < "$1" > /dev/null 2>&1
  $R info commandstats | grep -o 'cmdstat_fcall:calls=[0-9]*,usec=[0-9]*,usec_per_call=[0-9.]*' | sed 's/.*calls=\([0-9]*\).*usec_per_call=/\1 /'
}
gen() { # ns key prefix-of-target delivery-tag round
  python3 - "$@" <<'PY'
import sys
fn, key, kind, round_ = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
lim = "1000000 30000 30000 600000 3600000"
out = []
if kind == 'sticky':
    for j in range(20):
        for k in range(256):
            out.append(f"FCALL {fn} 1 {key} {key} rep o/s#{k:012d} r{round_}d{j} {lim}\r\n")
elif kind == 'creating':
    for k in range(5120):
        out.append(f"FCALL {fn} 1 {key} {key} rep o/n{round_}#{k} d {lim}\r\n")
else:
    for k in range(5120):
        out.append(f"FCALL {fn} 1 {key} {key} rep o/s#1 d{k} {lim}\r\n")
sys.stdout.write(''.join(out))
PY
}
for round in 1 2 3; do
  gen ${NS}_admit $K sticky $round > "$dir/w1"; gen wr_floor_sticky $F sticky $round > "$dir/w2"
  gen ${NS}_admit $K creating $round > "$dir/w3"; gen wr_floor_creating $F creating $round > "$dir/w4"
  gen wr_floor_noop $F noop $round > "$dir/w5"
  echo "round $round: sticky $(run "$dir/w1") floor $(run "$dir/w2") | creating $(run "$dir/w3") floor $(run "$dir/w4") | noop $(run "$dir/w5")"
done
$R shutdown nosave > /dev/null 2>&1 || true
rm -rf "$dir"
