#!/bin/bash
# A worker over many tasks, as a month of them would run through one: what
# its own process holds (open files, goroutines, resident memory, from its
# metrics endpoint) after each stretch of work. One `sched worker --queues
# gpu=1,append=1,ingest=2` serves a CPU run of SEGMENTS segments (20 steps
# each, a checkpoint every 10) and then ROUNDS ingests of FILES local files
# each, every one into a store of its own (a shard and an append per file).
# A leak shows as a count that grows with the tasks. Needs sched and
# redis-server on PATH; `sched demo --duration 5s` makes the tokenizer and
# store the run reads. Output: one line a sample.
#
#     SEGMENTS=200 ROUNDS=4 FILES=300 bash docs/benchmarks/worker-soak.sh
set -euo pipefail
SEGMENTS=${SEGMENTS:-200}; ROUNDS=${ROUNDS:-4}; FILES=${FILES:-300}
PORT=${PORT:-6397}; METRICS=${METRICS:-127.0.0.1:9499}
D=$(mktemp -d)
sched demo --duration 5s --dir "$D/demo" > "$D/demo.log" 2>&1 || { tail "$D/demo.log"; exit 1; }
mkdir -p "$D/data/objects" "$D/data/src"
cp -r "$D/demo/tokens" "$D/demo/tokenizers" "$D/data/"
cp -r "$D/demo/objects/tokenizers" "$D/data/objects/"
cat > "$D/runs.yaml" <<Y
soak:
  model: tiny
  seq: 64
  batch: 2
  lr: 1.0e-3
  warmup: 10
  total_steps: $((SEGMENTS * 20))
  log_every: 5
  eval_every: 20
  eval_batches: 1
  checkpoint_every: 10
  seed: 7
  precision: fp32
  engine: cpu
  tokenizer: go-4096
  mixture:
    - {store: go-stdlib, weight: 1}
  retention:
    keep_last: 2
  segment:
    max_steps: 20
Y
redis-server --port "$PORT" --save '' --appendonly no --dir "$D" > "$D/redis.log" 2>&1 &
RPID=$!
export KILN_REDIS_URL=redis://127.0.0.1:$PORT/0 KILN_DATA_DIR=$D/data KILN_RUNS=$D/runs.yaml KILN_LOG_FORMAT=json KILN_METRICS_ADDR=$METRICS
until sched config --check > /dev/null 2>&1; do sleep 0.2; done
sched worker --queues gpu=1,append=1,ingest=2 > "$D/worker.log" 2>&1 &
WPID=$!
trap 'kill $WPID $RPID 2>/dev/null; wait; rm -rf "$D"' EXIT
sample() {
  until curl -sf "http://$METRICS/metrics" > "$D/m" 2>/dev/null; do sleep 0.2; done
  printf '%-28s fds %s  goroutines %s  rss %s MB\n' "$1" \
    "$(awk '/^process_open_fds /{print $2}' "$D/m")" "$(awk '/^go_goroutines /{print $2}' "$D/m")" \
    "$(awk '/^process_resident_memory_bytes /{printf "%.0f", $2/1048576}' "$D/m")"
}
completed() { sched status 2>/dev/null | awk -v q="$1" '$1 == q {print $NF}'; }
sample "started"
sched enqueue train soak > /dev/null
while ! sched status 2>/dev/null | grep -q '^soak  done'; do sleep 5; sample "segments: $(completed gpu)"; done
for r in $(seq 1 "$ROUNDS"); do
  python3 - "$D/data/src" "$r" "$FILES" <<'PY'
import json, sys
d, r, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with open(f"{d}/r{r}_f{i:04d}.jsonl", "w") as f:
        for j in range(20):
            f.write(json.dumps({"text": f"package main // round {r} file {i} doc {j}\nfunc main() {{ println({i * j}) }}\n"}) + "\n")
PY
  before=$(completed append); before=${before:-0}
  sched enqueue ingest "local:$D/data/src/r${r}_*.jsonl" --store "soak$r" --tokenizer go-4096 > /dev/null
  while [ "$(completed append)" -lt $((before + FILES)) ]; do sleep 2; done
  sample "ingest round $r: $(completed append) appends"
done
