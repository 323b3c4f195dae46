package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's byte-level alphabet: every byte maps to a printable
// rune so that vocabularies can be stored as JSON strings. Printable Latin-1
// bytes map to themselves; the other 68 bytes map to U+0100 and up in order.
var byteToRune [256]rune

// runeToByte inverts byteToRune: runeToByte[r] is the byte plus one, or 0
// for a rune outside the alphabet. An array, not a map: a load decodes
// every character of the vocabulary through it.
var runeToByte [256 + 68]uint16

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = uint16(b) + 1
	}
}

// byteLevelDecode turns a token as written in tokenizer.json into the bytes
// it stands for. ok is false when a rune is outside the byte-level alphabet
// (an added token such as "<|endoftext|>" maps fine; one written with other
// characters does not); HF's ByteLevel decoder then emits the token's own
// UTF-8 bytes, and so does Decode.
func byteLevelDecode(tok string) (b []byte, ok bool) {
	return byteLevelDecodeAppend(make([]byte, 0, len(tok)), tok)
}

// byteLevelDecodeAppend is byteLevelDecode appending to dst.
func byteLevelDecodeAppend(dst []byte, tok string) (b []byte, ok bool) {
	n := len(dst)
	for _, r := range tok {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] == 0 {
			return append(dst[:n], tok...), false
		}
		dst = append(dst, byte(runeToByte[r]-1))
	}
	return dst, true
}

// byteLevelEncode writes raw bytes in the byte-level alphabet, as trained
// vocabularies are stored.
func byteLevelEncode(b []byte) string {
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = utf8.AppendRune(out, byteToRune[c])
	}
	return string(out)
}
