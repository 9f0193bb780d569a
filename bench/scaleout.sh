#!/usr/bin/env bash
# The scale-out series for a many-core machine (docs/PERFORMANCE.md, "Scale-out"): one
# Redis against a local 3-master Redis Cluster, more nodes each with [processes]. One JSON
# line per run, appended to $OUT/scaleout.jsonl (or ./scaleout.jsonl), the targets first.
# Needs ~10 minutes and 16 cores; on 2 cores run single lines of it with smaller N.
# PYTHON names the interpreter (default python3).
set -u
py="${PYTHON:-python3}"
out="${OUT:-.}/scaleout.jsonl"
run() {
  echo "== bench fire $*" >&2
  timeout 200 "$py" -m bench fire "$@" --concurrency 1000 >>"$out" \
    || echo "{\"failed\": \"$*\"}" >>"$out"
  tail -n 1 "$out" >&2
}
# The interval is 5 s and the window 20 s (30 s runs).
# A Cluster's busiest master fills first: the bench namespace's 64 partitions (a Cluster's
# default) and 12 types sit 21/20/23 and 4/5/3 on 3 masters; 16 partitions 4/5/7.
spread=(--cluster 3 --types 12)
run 500000 5 30 --nodes 6 --processes 2 "${spread[@]}"   # 100,000/s, 3 shards
run 200000 5 30 --nodes 4 --processes 2                  # 40,000/s, one Redis
run 50000 5 30 --nodes 1 --processes 1                   # 10,000/s: the machine's class
run 150000 5 30 --nodes 3 --processes 2                  # 30,000/s, one Redis
run 300000 5 30 --nodes 6 --processes 2                  # 60,000/s, one Redis (past its core)
run 400000 5 30 --nodes 6 --processes 2 "${spread[@]}"   # 80,000/s, 3 shards
run 300000 5 30 --nodes 6 --processes 2 "${spread[@]}"   # 60,000/s, 3 shards
run 500000 5 30 --nodes 6 --processes 2 --cluster 3 --types 6 --set scheduler.partitions=16
# A line a run, for reading at a glance (the JSON lines above hold everything).
"$py" - "$out" <<'PY' >&2
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "failed" in r:
        print("failed:", r["failed"])
        continue
    print(f"{r['n']:>7} tasks, {r['nodes']} nodes x {r['processes']}, shards {r['shards'] or 1}:"
          f" {r['exec_per_s']:,}/s, missed {r['missed']:,}, dup {r['duplicates']},"
          f" lag p50/p99 {r['lag_p50_ms']}/{r['lag_p99_ms']} ms,"
          f" Redis {r['redis_cpu_pct_per_shard']} % of a core,"
          f" us a fire: Redis {r['redis_cpu_us_per_fire']}, node {r['node_cpu_us_per_fire']}")
PY
