#!/bin/bash
# Where the 16 cores' time goes in `sched tokenize` on 1 GB (gpt2 style), in
# one call on the GPU host (about 30 s): the whole process on 16 cores and
# on one, twice, with wall, user and system seconds and peak RSS; the
# collections of a 16-core run (GODEBUG=gctrace=1); BenchmarkTokenizeFile
# in process at 16 (encoding-%, ramp-ms, tail-ms); and a Go execution trace
# of it on 256 MB ($OUT/trace.out: `go tool trace -pprof=sched`). Carry
# .carry/tokenizer (docs/benchmarks/tokenizer-carry-prep.sh); run from the
# repository root.
OUT=${OUT:-/tmp/tokenizer-probe}; mkdir -p $OUT
source docs/benchmarks/tokenizer-corpus.sh; C=.carry/tokenizer; w=/dev/shm/tok; mkdir -p $w
gzip -dc $C/go20.txt.gz > $w/go20.txt; gzip -dc $C/prose.txt.gz > $w/prose.txt
mixed_corpus $w/go20.txt $w/prose.txt 1000000000 > $w/corpus.txt; head -c 256000000 $w/corpus.txt > $w/c256.txt
gzip -dc $C/sched.gz > $w/sched; gzip -dc $C/tokenizer.test.gz > $w/tokenizer.test; chmod +x $w/sched $w/tokenizer.test
tj=$C/gpt2-style.tokenizer.json
for i in 1 2; do for p in 16 1; do pin=; [ $p = 1 ] && pin="taskset -c 0"
  rm -f $w/ids; /usr/bin/time -f "P=$p %e s wall %U user %S sys %M KB" env GOMAXPROCS=$p $pin $w/sched tokenize --tokenizer-file $tj --in $w/corpus.txt --out $w/ids --dtype u16 2>&1 | tail -1
done; done
rm -f $w/ids; GODEBUG=gctrace=1 GOMAXPROCS=16 $w/sched tokenize --tokenizer-file $tj --in $w/corpus.txt --out $w/ids --dtype u16 2>&1 | grep -c '^gc '
rm -f $w/ids; GODEBUG=gctrace=1 GOMAXPROCS=16 $w/sched tokenize --tokenizer-file $tj --in $w/corpus.txt --out $w/ids --dtype u16 2>&1 | grep '^gc ' | tail -5
(cd tokenizer && KILN_TOKENIZER_BENCH_TEXT=$w/corpus.txt $w/tokenizer.test -test.run '^$' -test.bench 'TokenizeFile/gpt2-style/cold$' -test.benchtime 3x -test.cpu 16)
(cd tokenizer && KILN_TOKENIZER_BENCH_TEXT=$w/c256.txt $w/tokenizer.test -test.run '^$' -test.bench 'TokenizeFile/gpt2-style/cold$' -test.benchtime 1x -test.cpu 16 -test.trace $OUT/trace.out) | tail -3
ls -la $OUT
