package runs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A mistake yaml reports below "yaml: unmarshal errors:", on a line of its
// own (a key written twice, a from: that is no name), is said on one line
// that names the line at fault: a one-line view of the error kept
// "yaml: unmarshal errors:" alone.
func TestARunsFileMistakeIsOneLine(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"dt3:\n  from: pilot\n  min_free_disk: 1GiB\n  min_free_disk: 2GiB\n", `run dt3: line 4: mapping key "min_free_disk" already defined at line 3`},
		{"dt3:\n  from: pilot\n  from: eta\n", `run dt3: line 3: mapping key "from" already defined at line 2`},
		{"dt3:\n  from: [pilot]\n", "run dt3: line 2: cannot unmarshal !!seq into a string"},
	} {
		path := filepath.Join(t.TempDir(), "runs.yaml")
		if err := os.WriteFile(path, []byte(c.file), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("runs file %q: %q; want one line ending %q", c.file, err, c.want)
		}
	}
}
