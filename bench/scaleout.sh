#!/usr/bin/env bash
# The scale-out series for a many-core machine (docs/PERFORMANCE.md, "Scale-out"): one
# Redis against a local Redis Cluster, more nodes each with [processes]. One JSON line per
# run, appended to $OUT/scaleout.jsonl (or ./scaleout.jsonl). Needs ~9 minutes and ~14
# cores; on 2 cores run single lines of it with smaller N.
set -u
out="${OUT:-.}/scaleout.jsonl"
run() {
  echo "== bench fire $*" >&2
  timeout 240 python3 -m bench fire "$@" --concurrency 1000 >>"$out" || echo "{\"failed\": \"$*\"}" >>"$out"
}
run 100000 10 40 --nodes 1 --processes 1               # 10,000/s, one Redis
run 200000 10 40 --nodes 2 --processes 2               # 20,000/s, one Redis
run 200000 10 40 --nodes 2 --processes 2 --cluster 3   # 20,000/s, 3 shards
run 400000 10 40 --nodes 4 --processes 2               # 40,000/s, one Redis (the per-shard target)
run 400000 10 40 --nodes 4 --processes 2 --cluster 3   # 40,000/s, 3 shards
run 600000 10 40 --nodes 6 --processes 2 --cluster 3   # 60,000/s, 3 shards
cat "$out"
