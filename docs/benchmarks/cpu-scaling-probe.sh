#!/bin/bash
# How far the host's cores scale on work that shares nothing and touches
# almost no memory: a Python loop, 1 process pinned to CPU 0, then one
# pinned to each CPU at once, best of three. Its speed-up at 16 bounds what
# any CPU-bound code (the tokenizer's included) can reach there. Prints
# lscpu's topology lines and the speed-ups; output under $OUT.
OUT=${OUT:-/tmp/cpu-probe}; mkdir -p $OUT
N=${N:-30000000}
loop="import time; t=time.perf_counter(); s=0
for i in range($N): s+=i
print(time.perf_counter()-t)"
{
lscpu | grep -E '^(CPU\(s\)|Thread|Core|Socket|Model name|L3|NUMA node\(s\))'
echo "thread siblings of cpu0: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list)"
P=$(nproc)
for round in 1 2 3; do
  one=$(taskset -c 0 python3 -c "$loop")
  start=$(date +%s.%N)
  for c in $(seq 0 $((P-1))); do taskset -c $c python3 -c "$loop" > $OUT/p$c.txt & done; wait
  end=$(date +%s.%N)
  all=$(cat $OUT/p*.txt | sort -n | tail -1)
  python3 -c "print(f'round $round: one process {$one:.3f} s; $P at once, slowest {$all:.3f} s, wall {$end-$start:.3f} s; speed-up {$P*$one/$all:.2f}x')"
done
} 2>&1 | tee $OUT/probe.txt
