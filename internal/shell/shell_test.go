package shell

import (
	"os/exec"
	"testing"
)

// Each quoted argument, given to a real shell, is the path it quotes.
func TestQuoteIsOneWordToAShell(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	for _, s := range []string{"data/tokenizers/kiln", "my data/new dir", "it's here", `a"b`, "$HOME/x", "a\\b", "tab\there", "x`y`", "wow!"} {
		q := Quote(s)
		out, err := exec.Command(sh, "-c", "printf %s "+q).Output()
		if err != nil || string(out) != s {
			t.Errorf("Quote(%q) = %s; the shell read %q (%v)", s, q, out, err)
		}
	}
	if q := Quote("data/tokenizers/kiln-bpe"); q != "data/tokenizers/kiln-bpe" {
		t.Errorf("a plain path is quoted: %s", q)
	}
	if q := Quote("my data/x"); q != `"my data/x"` {
		t.Errorf("a path with a space: %s; want it in double quotes", q)
	}
}
