#!/usr/bin/env bash
# Builds .carry/tokenizer/ for docs/benchmarks/tokenizer-device-run.sh, on a
# machine with the Go toolchain, from the repository root:
#
#     bash docs/benchmarks/tokenizer-carry-prep.sh [PEER]
#
# PEER is the tiktoken comparison script (default ../shared/bench/tiktoken_peer.py).
# Carry the folder .carry/tokenizer (CARRY overrides it). It then holds
# about 24 MB (the device run makes the large texts from these):
#   sched.gz            `sched`, CGO_ENABLED=0, stripped, gzipped
#   tokenizer.test.gz   the tokenizer package's tests and benchmarks, same build
#   tiktoken_peer.py    the comparison script: HF tokenizers and tiktoken beside `sched tokenize`
#   gpt2-style.tokenizer.json, gpt4-style.tokenizer.json   the golden vocabularies
#   go20.txt.gz         the first 20 MB (20,000,000 bytes) of the Go sources under
#                       $(go env GOROOT)/src, *.go files in byte order of their paths, concatenated
#   prose.txt.gz        English prose: three Project Gutenberg books from the test data of
#                       modules in go.mod (klauspost/compress, andybalholm/brotli, pierrec/lz4)
#                       and Vim's help files from /usr/share/vim (when installed)
set -euo pipefail
peer=${1:-../shared/bench/tiktoken_peer.py}
out=${CARRY:-.carry/tokenizer}
mkdir -p "$out"

CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$out/sched" ./cmd/sched
gzip -9f "$out/sched"
CGO_ENABLED=0 go test -c -trimpath -ldflags '-s -w' -o "$out/tokenizer.test" ./tokenizer
gzip -9f "$out/tokenizer.test"
cp "$peer" "$out/tiktoken_peer.py"
for s in gpt2 gpt4; do
	gzip -dc "tokenizer/testdata/$s-style.tokenizer.json.gz" > "$out/$s-style.tokenizer.json"
done

# LC_ALL=C: the same file order, hence the same 20 MB, on every machine.
# head ends the pipeline early, so its status is not pipefail's to judge;
# the size is checked instead.
set +o pipefail
(cd "$(go env GOROOT)/src" && find . -name '*.go' -type f | LC_ALL=C sort | xargs cat) 2>/dev/null |
	head -c 20000000 | gzip -9 > "$out/go20.txt.gz"
set -o pipefail
n=$(gzip -dc "$out/go20.txt.gz" | wc -c)
[ "$n" -eq 20000000 ] || { echo "go20.txt: $n bytes of Go sources, want 20000000" >&2; exit 1; }

prose=()
for m in github.com/klauspost/compress github.com/andybalholm/brotli github.com/pierrec/lz4/v4; do
	dir=$(go mod download -json "$m" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	for f in "$dir"/testdata/Mark.Twain-Tom.Sawyer.txt "$dir"/testdata/Isaac.Newton-Opticks.txt "$dir"/testdata/pg1661.txt; do
		if [ -f "$f" ]; then prose+=("$f"); fi
	done
done
for f in /usr/share/vim/vim*/doc/*.txt; do
	if [ -f "$f" ]; then prose+=("$f"); fi
done
cat "${prose[@]}" | gzip -9 > "$out/prose.txt.gz"

du -ch "$out"/* | tail -1
