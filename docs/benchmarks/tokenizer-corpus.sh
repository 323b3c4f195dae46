# Sourced by the tokenizer's device scripts: mixed_corpus CODE PROSE BYTES
# writes to stdout the mixed text they train and encode: the Go text and the
# prose in turns, each turn rotated by a different number of lines (a fixed
# sequence, so every run sees the same bytes), about 70% code, cut at BYTES.

# rotate FILE K: FILE's lines from K on, then the lines before K.
rotate() { tail -n +"$2" "$1"; head -n $(($2 - 1)) "$1"; }

mixed_corpus() {
	local code=$1 prose=$2 bytes=$3 code_lines prose_lines
	code_lines=$(wc -l < "$code")
	prose_lines=$(wc -l < "$prose")
	# head ends the pipeline early; its status is not the loop's to judge.
	{
		for i in $(seq 0 40); do
			rotate "$code" $((1 + i * 7919 % code_lines))
			rotate "$prose" $((1 + i * 104729 % prose_lines))
		done
	} 2>/dev/null | head -c "$bytes"
}
