#!/bin/bash
# The GPU worker's day on one machine: real redis-server, `sched worker
# --queues gpu=1,append=2` as compose runs it (KILN_REQUIRE_GPU=1), a run of
# engine auto enqueued, the worker stopped with SIGTERM mid-run and started
# again, the run to its end; then status, runs and the worker's log lines.
# MODEL/BATCH/ACCUMULATE/STEPS/EVERY/STOPAT and REQUIRE set the shape
# (defaults: the GPU's). KILN_GPUS in the environment reaches the worker as
# compose's does: `KILN_GPUS=all ACCUMULATE=2` trains the run on every GPU
# of the host (accumulate a multiple of the GPUs). BENCH=0 leaves out the
# run's step measured by the worker at the end. $G (`FOR=worker bash docs/benchmarks/gpu-carry-prep.sh`)
# holds sched.gz and demo.tgz (a `sched demo` directory's
# tokens/, tokenizers/ and objects/tokenizers/: `sched demo --duration 5s
# --dir D`, then `tar czf demo.tgz -C D tokens tokenizers
# objects/tokenizers`); redis-server on PATH (carried with its libraries
# where the host has none). On a machine without a GPU, REQUIRE=0 and a
# smaller shape (MODEL=tiny BATCH=2 SEQ=64 STEPS=600 EVERY=100 STOPAT=250)
# run the same day on the CPU.
OUT=${OUT:-/tmp/gw}; mkdir -p $OUT
G=${G:-$PWD/.carry/g}
if [ -f $G/sched.gz ]; then B=$(mktemp -d); gzip -dc $G/sched.gz > $B/sched; chmod +x $B/sched; export PATH=$B:$PATH; fi
S=$SECONDS; log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
MODEL=${MODEL:-small}; BATCH=${BATCH:-8}; ACCUMULATE=${ACCUMULATE:-1}; SEQ=${SEQ:-1024}; STEPS=${STEPS:-4000}; EVERY=${EVERY:-500}; STOPAT=${STOPAT:-1500}; REQUIRE=${REQUIRE:-1}
D=$(mktemp -d); tar xzf $G/demo.tgz -C $D
cat > $D/runs.yaml <<Y
live:
  model: $MODEL
  seq: $SEQ
  batch: $BATCH
  accumulate: $ACCUMULATE
  lr: 6.0e-4
  warmup: 50
  total_steps: $STEPS
  log_every: 50
  eval_every: 0
  eval_batches: 0
  checkpoint_every: $EVERY
  seed: 7
  precision: bf16
  tokenizer: go-4096
  mixture:
    - {store: go-stdlib, weight: 1}
  retention:
    keep_last: 2
Y
redis-server --port 6391 --save '' --appendonly no --dir $D > $OUT/redis.log 2>&1 &
RPID=$!; sleep 1
export KILN_REDIS_URL=redis://127.0.0.1:6391/0 KILN_DATA_DIR=$D KILN_RUNS=$D/runs.yaml KILN_LOG_FORMAT=json KILN_SHUTDOWN_GRACE=60s KILN_REQUIRE_GPU=$REQUIRE
log check; sched config --check 2>&1 | tail -4
worker() { sched worker --queues gpu=1,append=2 >> $OUT/worker.log 2>&1 & WPID=$!; }
log enqueue; sched enqueue train live 2>&1 | tail -2
worker
until grep -q "\"step\":$STOPAT," $D/runs/live/metrics.jsonl 2>/dev/null || ! kill -0 $WPID 2>/dev/null; do sleep 0.05; done
log stop; kill -TERM $WPID; wait $WPID; echo "worker rc=$?"
sched runs 2>&1 | head -8
log restart; worker
for i in $(seq 1 600); do sched status 2>/dev/null | grep -q '^live  done' && break; sleep 0.5; done
log done; sched status 2>&1 | sed -n '/^RUNS/,/^FAILURES/p'
sched runs 2>&1 | head -8
# The run's own step measured by the worker, as `sched enqueue bench RUN`
# queues it: on several GPUs, a row for all of them and one for one GPU,
# with the scaling between them.
if [ "${BENCH:-1}" = 1 ]; then
  log bench; sched enqueue bench live 2>&1 | tail -2
  for i in $(seq 1 1200); do sched runs 2>/dev/null | grep -q 'bench:run.*completed' && break; sleep 0.5; done
  sched runs 2>&1 | grep 'bench:run'; sched results bench 2>&1
fi
kill -TERM $WPID; wait $WPID
log worker-log; grep -E '"msg":"(gpu|cuda|step|worker started|resuming[^"]*|checkpoint[^"]*|this worker[^"]*)"' $OUT/worker.log | cut -c1-260 | awk 'NR<=6 || /resum|stop|gpu|cuda/ || NR%20==0' | head -60
python3 - $D/runs/live/metrics.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows]
dup = len(steps) - len(set(steps))
print("metrics lines", len(rows), "steps", steps[0], "..", steps[-1], "repeated steps", dup,
      "tok/s median", sorted(r.get("tok_per_s", 0) for r in rows)[len(rows)//2])
PY
ls $D/objects/checkpoints/live/ 2>&1 | head
kill $RPID
log end
