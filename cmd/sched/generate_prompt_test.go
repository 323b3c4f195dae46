package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
)

// A prompt that alone takes the model's every position is told to be
// shortened: lowering --max-tokens, which it was told, cannot help it, at
// 1 or at any value. Where the prompt leaves room, lowering --max-tokens
// is said with the value that fits.
func TestGeneratePromptLongerThanTheContext(t *testing.T) {
	t.Parallel()
	dir, c := makeCheckpoint(t)
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	// A prompt of exactly n tokens, as the checkpoint's tokenizer reads it.
	promptOf := func(n int) string {
		t.Helper()
		p := "func main() {"
		for len(tok.Encode(p)) < n {
			p += " x"
		}
		if got := len(tok.Encode(p)); got != n {
			t.Fatalf("a prompt of %d tokens came out %d", n, got)
		}
		return p
	}
	gen := func(prompt string, maxTokens int) []string {
		return []string{"generate", "--checkpoint", dir, "--prompt", prompt, "--max-tokens", fmt.Sprint(maxTokens), "--temperature", "0", "--engine", "cpu"}
	}
	long, full, short := promptOf(c.MaxPositions+40), promptOf(c.MaxPositions), promptOf(c.MaxPositions-56)
	for _, tc := range []struct {
		prompt    string
		maxTokens int
		want      string
	}{
		{long, 1, fmt.Sprintf("--prompt is %d tokens, which alone exceeds the model's %d positions (max_position_embeddings), leaving none to generate into: shorten the prompt to at most %d tokens (the %d positions less --max-tokens 1)",
			c.MaxPositions+40, c.MaxPositions, c.MaxPositions-1, c.MaxPositions)},
		{full, 6, fmt.Sprintf("--prompt is %d tokens, which alone fills the model's %d positions (max_position_embeddings), leaving none to generate into: shorten the prompt to at most %d tokens",
			c.MaxPositions, c.MaxPositions, c.MaxPositions-6)},
		{long, c.MaxPositions + 4, fmt.Sprintf("leaving none to generate into: shorten the prompt, and lower --max-tokens %d: the two together must fit in %d", c.MaxPositions+4, c.MaxPositions)},
		{short, 100, fmt.Sprintf("--prompt (%d tokens) plus --max-tokens 100 exceeds the model's %d positions (max_position_embeddings): lower --max-tokens to 56 or less, or shorten the prompt",
			c.MaxPositions-56, c.MaxPositions)},
	} {
		out, errOut, code := runModelCLI(t, gen(tc.prompt, tc.maxTokens)...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("generate a prompt of %d tokens with --max-tokens %d: exit %d\n%s%s\nwant exit 2 and one line containing %q",
				len(tok.Encode(tc.prompt)), tc.maxTokens, code, out, errOut, tc.want)
		}
		if tc.prompt != short && strings.Contains(errOut, "lower --max-tokens to") {
			t.Errorf("a prompt of %d tokens with --max-tokens %d is told %q: lowering --max-tokens alone cannot help it", len(tok.Encode(tc.prompt)), tc.maxTokens, errOut)
		}
	}
	// One that fits still generates.
	if out, errOut, code := runModelCLI(t, gen(short, 56)...); code != 0 {
		t.Errorf("a prompt of %d tokens with --max-tokens 56: exit %d\n%s%s", c.MaxPositions-56, code, out, errOut)
	}
}
