#!/bin/bash
# What the ids' writing and the collector cost `sched tokenize` on 16 cores
# (1 GB of the mixed corpus, gpt2 style), in one call on the GPU host (about
# 90 s): per round, one core (GOMAXPROCS=1), then 16 cores with the ids to
# /dev/null, over the previous run's file, to a new file, and as u32 to a
# new file; wall, user and system seconds and peak RSS each; then the
# collections of one 16-core run (gctrace). Carry
# .carry/tokenizer (docs/benchmarks/tokenizer-carry-prep.sh); run from the
# repository root. ROUNDS (default 3).
OUT=${OUT:-/tmp/tokenizer-write-probe}; mkdir -p $OUT
source docs/benchmarks/tokenizer-corpus.sh; C=${CARRY:-.carry/tokenizer}; w=$(mktemp -d -p /dev/shm)
trap 'rm -rf "$w"' EXIT
gzip -dc $C/go20.txt.gz > $w/go20.txt; gzip -dc $C/prose.txt.gz > $w/prose.txt
mixed_corpus $w/go20.txt $w/prose.txt 1000000000 > $w/corpus.txt
gzip -dc $C/sched.gz > $w/sched; chmod +x $w/sched
tj=$C/gpt2-style.tokenizer.json
run() { # NAME OUTFILE DTYPE ENV... (force=--force to replace OUTFILE)
	local name=$1 out=$2 dtype=$3; shift 3
	/usr/bin/time -f "$name %e s wall %U user %S sys %M KB" env "$@" $w/sched tokenize --tokenizer-file $tj \
		--in $w/corpus.txt --out $out --dtype $dtype ${force:-} 2>&1 | tail -2 | tr '\n' ' '; echo
}
{
echo "host: $(nproc) cores, $(date -u +%FT%TZ)"
for i in $(seq ${ROUNDS:-3}); do
	rm -f $w/ids
	run one-core $w/ids u16 GOMAXPROCS=1
	run all-devnull /dev/null u16
	force=--force run all-over-previous $w/ids u16
	rm -f $w/ids; run all-new-file $w/ids u16
	rm -f $w/ids; run all-new-file-u32 $w/ids u32
done
rm -f $w/ids
echo "collections on $(nproc) cores: $(GODEBUG=gctrace=1 $w/sched tokenize --tokenizer-file $tj --in $w/corpus.txt --out $w/ids 2>&1 | grep -c '^gc ')"
rm -f $w/ids; GODEBUG=gctrace=1 $w/sched tokenize --tokenizer-file $tj --in $w/corpus.txt --out $w/ids 2>&1 | grep '^gc ' | tail -4
} 2>&1 | tee $OUT/write-probe.txt
