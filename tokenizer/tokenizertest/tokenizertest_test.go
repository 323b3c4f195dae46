package tokenizertest

import (
	"strings"
	"testing"
)

func TestFilesAndDocuments(t *testing.T) {
	if tj := Tokenizer(t, "gpt2-style"); !strings.Contains(string(Tokenizer(t, "gpt4-style")), `"model"`) || len(tj) == 0 {
		t.Fatal("golden tokenizer.json files are not readable")
	}
	text := Text(t, "go")
	docs := Documents(text, 1000)
	if strings.Join(docs, "") != text {
		t.Fatal("documents do not put the text back together")
	}
	for _, d := range docs[:len(docs)-1] {
		if !strings.HasSuffix(d, "\n") || len(d) < 1000 {
			t.Fatalf("a document of %d bytes does not end a line after 1000 bytes", len(d))
		}
	}
}
