#!/bin/bash
# One call on a GPU host: the group's tests (a one-rank communicator on one GPU; two ranks where the host
# has two), native and forced sm_80; the trainer's run on every GPU resumed on one, and 200 steps on every
# GPU against one at the same global batch (fp32 and bf16, loss within 1% at every logged step), native
# and forced sm_80; and `sched bench` on one GPU against `--gpus all` at the issue's two shapes, small
# 32 x 1024 and base 16 x 1024 a GPU, alternated (with two GPUs `sched bench` prints the scaling
# efficiency); and NCCL's all-reduce bus bandwidth for 1 to 256 MiB over every GPU (kernels/cuda's
# BenchmarkAllReduce: the figure that decides buckets overlapped with the backward), and the all-reduce's
# share of a profiled step on every GPU. The gradients summed in buckets during the backward
# (KILN_NCCL_BUCKET_MB) are measured beside the one all-reduce after it: the group's tests take both, the
# trainer's run on every GPU again with buckets, and the bench alternates one GPU, every GPU, and every GPU
# with buckets of each size in BUCKETS (MiB, default "25"). ROUNDS (default 2) sets the bench's
# alternations; SHAPES (default "small:32 base:16") its shapes; PROFILE_SHAPES (default "base:16") the
# profiled ones.
# Run from the repository root with .carry/g holding what was built on the development machine
# (`FOR=multi bash docs/benchmarks/gpu-carry-prep.sh` builds it): sched.gz, kernels.test.gz, trainer.test.gz and
# cuda.test.gz; torch_peer.py for the PyTorch DDP peer (docs/benchmarks/ddp_peer.py; PEER=0 skips it);
# store.tgz, `sched demo`'s token store and tokenizer, for the SIGTERM runs.
# Output goes to $OUT (default /tmp/multi-gpu-run).
C=${C:-$PWD/.carry/g}; OUT=${OUT:-/tmp/multi-gpu-run}; mkdir -p $OUT /tmp/mg-bin; G=/tmp/mg-bin
for f in sched kernels.test trainer.test cuda.test; do [ -f $C/$f.gz ] && gunzip -c $C/$f.gz > $G/$f && chmod +x $G/$f; done
export NCCL_NVLS_ENABLE=0
BUCKETS=${BUCKETS:-25}
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=index,name,driver_version,memory.used,utilization.gpu --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -5
log group tests, native
(cd kernels && timeout 200 $G/kernels.test -test.v -test.run 'Group|GPUFailing|NCCL|GraphSteps|GoldenFP32|StoppedPartWay|Buckets' > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|largest weight" $OUT/tests_native.log | tail -30
log group tests, sm80
(cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 150 $G/kernels.test -test.v -test.run 'Group|GPUFailing|StoppedPartWay|BucketsTrain' > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/tests_sm80.log | tail -20
log trainer on every GPU: resumed on one, and 200 steps against one
(cd trainer && timeout 200 $G/trainer.test -test.v -test.run 'RunOnEveryGPU|EveryGPUFollows' > $OUT/trainer.log 2>&1; echo "rc=$?" >> $OUT/trainer.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|step 6|curves at most" $OUT/trainer.log | tail -20
log trainer on every GPU, sm80
(cd trainer && KILN_CUDA_FORCE_SM80=1 timeout 200 $G/trainer.test -test.v -test.run 'RunOnEveryGPU|EveryGPUFollows' > $OUT/trainer_sm80.log 2>&1; echo "rc=$?" >> $OUT/trainer_sm80.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|curves at most" $OUT/trainer_sm80.log | tail -20
log "trainer on every GPU, the gradients summed in buckets of ${BUCKETS%% *} MiB during the backward"
(cd trainer && KILN_NCCL_BUCKET_MB=${BUCKETS%% *} timeout 200 $G/trainer.test -test.v -test.run 'RunOnEveryGPU|EveryGPUFollows' > $OUT/trainer_buckets.log 2>&1; echo "rc=$?" >> $OUT/trainer_buckets.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|step 6|curves at most" $OUT/trainer_buckets.log | tail -20
if [ -f $C/store.tgz ]; then
  # The user's path: `sched train` processes stopped with SIGTERM once step 60 is logged and resumed
  # with --resume on the other number of GPUs (every GPU -> one, one -> every GPU), each logged loss
  # against the same run uninterrupted on one GPU. Global batch 16 x 1024 either way: one GPU takes
  # two micro-batches of 8, two GPUs one each.
  log "sched train stopped with SIGTERM and resumed on the other number of GPUs"
  L=/tmp/mg-live; rm -rf $L; mkdir -p $L; (cd $L && tar xzf $C/store.tgz)
  T="$G/sched train --engine cuda --model small --batch 8 --accumulate 2 --seq 1024 --steps 160 --checkpoint-every 50 --log-every 10 --tokens tokens/go-stdlib --tokenizer-file tokenizer.json --seed 7"
  stopped() { # OUT_DIR GPUS [VAR=VALUE]: run, SIGTERM once step 60 is logged
    (cd $L && exec env $3 $T --gpus $2 --out $1 > $OUT/$1-1.log 2>&1) & local pid=$!
    until grep -q '"step":60,' $L/$1/metrics.jsonl 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.02; done
    kill -TERM $pid; wait $pid; echo "$1 on gpus=$2 stopped: rc=$? $(tail -1 $OUT/$1-1.log)"
  }
  (cd $L && $T --gpus 1 --out A > $OUT/A.log 2>&1); echo "A on one GPU, uninterrupted: rc=$?"
  stopped B all; (cd $L && $T --gpus 1 --out B --resume > $OUT/B-2.log 2>&1); echo "B resumed on one GPU: rc=$? $(head -c 300 $OUT/B-2.log | grep -m1 -i resum)"
  stopped C 1; (cd $L && $T --gpus all --out C --resume > $OUT/C-2.log 2>&1); echo "C resumed on every GPU: rc=$? $(head -c 300 $OUT/C-2.log | grep -m1 -i resum)"
  # D: as B, the gradients summed in buckets during the backward (a stop may land in a step's last round).
  stopped D all KILN_NCCL_BUCKET_MB=${BUCKETS%% *}; (cd $L && $T --gpus 1 --out D --resume > $OUT/D-2.log 2>&1); echo "D resumed on one GPU: rc=$? $(head -c 300 $OUT/D-2.log | grep -m1 -i resum)"
  python3 - $L <<'PY' | tee $OUT/sigterm.txt
import json, sys
def losses(run):
    d = {}
    for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl"):
        r = json.loads(l)
        if "loss" in r:
            d[r["step"]] = r["loss"]  # a step logged twice (before the stop and after the resume): the last
    return d
a = losses("A")
for run, how in (("B", "every GPU, stopped, resumed on one"), ("C", "one GPU, stopped, resumed on every GPU"),
                 ("D", "every GPU with buckets, stopped, resumed on one")):
    b = losses(run)
    missing = sorted(set(a) - set(b))
    rel = max(abs(b[s] - a[s]) / abs(a[s]) for s in a if s in b)
    print(f"{run} ({how}): {len(b)} steps logged, last {max(b)}, missing {missing or 'none'}; "
          f"largest difference from one GPU uninterrupted {100 * rel:.3f}% (loss {a[min(a)]:.4f} -> {a[max(a)]:.4f}): "
          + ("within 1%" if rel <= 0.01 and not missing else "NOT within 1%"))
PY
fi
if [ -x $G/cuda.test ]; then
  log "all-reduce bus bandwidth over every GPU"
  (cd kernels/cuda && timeout 150 $G/cuda.test -test.v -test.run '^$' -test.bench AllReduce -test.benchtime 20x > $OUT/allreduce.log 2>&1; echo "rc=$?" >> $OUT/allreduce.log)
  grep -E "^(Benchmark|FAIL|PASS|rc=|panic)|NCCL " $OUT/allreduce.log | tail -12
fi
if [ -f $C/torch_peer.py ] && [ "${PEER:-1}" != 0 ]; then
  # The peer: PyTorch DDP (torch.compile, buckets overlapped with the backward) at the same per-GPU
  # shapes, on one GPU and on every GPU; .carry/g/torch_peer.py is ../shared/bench/torch_peer.py.
  log "PyTorch DDP peer on one GPU and on every GPU"
  cp $C/torch_peer.py docs/benchmarks/ddp_peer.py $G/
  for n in $(printf '1\n%s\n' "$(nvidia-smi -L | wc -l)" | sort -un); do
    (cd $G && timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node=$n ddp_peer.py compile --plan ${PEER_PLAN:-small:32:1024,base:16:1024} 2>&1) \
      | grep -E '^(\{|FAILED|torch )' | tee -a $OUT/ddp_peer.txt
  done
fi
log bench
for shape in ${SHAPES:-small:32 base:16}; do
  for i in $(seq ${ROUNDS:-2}); do for v in 1 all $(for b in $BUCKETS; do echo all:$b; done); do
    g=${v%%:*}; b=off; [ "$v" != "$g" ] && b=${v#*:}
    echo "${shape%:*} ${shape#*:}x1024 gpus=$g buckets=$b $(KILN_NCCL_BUCKET_MB=$b timeout 120 $G/sched bench --engine cuda --model ${shape%:*} --batch ${shape#*:} --seq 1024 --steps 30 --gpus $g 2>&1 | tail -1)" | tee -a $OUT/bench.txt
  done; done
done
# Where a step's time goes on every GPU: the gradients' all-reduce is a line of the profile of its own
# (serialised, so it holds the wait for the slower GPU too), against the unprofiled step.
log "profile on every GPU: the all-reduce's share of a step"
for shape in ${PROFILE_SHAPES:-base:16}; do
  timeout 120 $G/sched bench --engine cuda --model ${shape%:*} --batch ${shape#*:} --seq 1024 --steps 10 --gpus all --profile > $OUT/profile-${shape%:*}.txt 2>&1
  echo "${shape%:*} ${shape#*:}x1024 gpus=all rc=$?: $(grep -E '^(kernel time per step|  NCCL all-reduce)' $OUT/profile-${shape%:*}.txt | tr -s ' ' | paste -sd';')" | tee -a $OUT/bench.txt
done
log end
