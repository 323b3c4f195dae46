package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every on/off setting takes the same words from every source: the
// environment, the flag and the config file, quoted or not, in any case.
// The variable and the flag took 1 and t but refused yes and on; the file
// took yes and on but refused 1 and "true".
func TestOnOffSettingsTakeTheSameWordsFromEverySource(t *testing.T) {
	t.Parallel()
	words := map[string]string{
		"true": "true", "TRUE": "true", "Yes": "true", "yes": "true", "on": "true", "ON": "true", "1": "true",
		"false": "false", "False": "false", "NO": "false", "no": "false", "Off": "false", "off": "false", "0": "false",
	}
	dir := t.TempDir()
	noRedis := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for w, want := range words {
		file := filepath.Join(dir, "plain-"+w+".yaml")
		quoted := filepath.Join(dir, "quoted-"+w+".yaml")
		if err := os.WriteFile(file, []byte("s3_secure: "+w+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(quoted, []byte("s3_secure: \""+w+"\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			from string
			env  []string
			args []string
		}{
			{"KILN_S3_SECURE=" + w, []string{"KILN_S3_SECURE=" + w}, nil},
			{"--s3-secure=" + w, nil, []string{"--s3-secure=" + w}},
			{"s3_secure: " + w, []string{"KILN_CONFIG=" + file}, nil},
			{`s3_secure: "` + w + `"`, []string{"KILN_CONFIG=" + quoted}, nil},
		} {
			out, errOut, code := sched(t, append(c.env, noRedis...), append([]string{"config"}, c.args...)...)
			if code != 0 || !strings.Contains(out, "KILN_S3_SECURE       s3-secure        "+want+"\n") {
				t.Errorf("%s: exit %d, want s3-secure %s\n%s%s", c.from, code, want, out, errOut)
			}
		}
	}

	// A key left empty is unset, as an empty variable is; the variable
	// still wins over the file.
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, []byte("s3_secure:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for env, want := range map[string]string{"": "false", "KILN_S3_SECURE=on": "true"} {
		out, errOut, code := sched(t, append([]string{"KILN_CONFIG=" + empty, env}, noRedis...), "config")
		if code != 0 || !strings.Contains(out, "KILN_S3_SECURE       s3-secure        "+want+"\n") {
			t.Errorf("s3_secure left empty, %q: exit %d, want s3-secure %s\n%s%s", env, code, want, out, errOut)
		}
	}
}

// KILN_REQUIRE_GPU takes the words KILN_S3_SECURE does.
func TestRequireGPUTakesTheSameWords(t *testing.T) {
	for v, want := range map[string]bool{"": false, "yes": true, "ON": true, "True": true, "1": true, "no": false, "Off": false, "FALSE": false, "0": false} {
		t.Setenv("KILN_REQUIRE_GPU", v)
		if got, err := envBool("KILN_REQUIRE_GPU"); err != nil || got != want {
			t.Errorf("KILN_REQUIRE_GPU=%q: %v, %v; want %v", v, got, err, want)
		}
	}
}

// A value that is no on/off word is refused in one line that names the
// setting as it was given, the config file's key and line included, and
// the words it takes: the file said "cannot unmarshal !!int `2` into true
// or false", naming no key.
func TestOnOffSettingsRefuseOtherWordsNamingTheSetting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(body string) string {
		f, err := os.CreateTemp(dir, "*.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(body); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return f.Name()
	}
	words := "write true, yes, on or 1, or false, no, off or 0 (in any case)"
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	two, quotedT, list := file("log_format: json\ns3_secure: 2\n"), file("s3_secure: \"t\"\n"), file("s3_secure: [1]\n")
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"KILN_S3_SECURE=maybe"}, nil, `environment KILN_S3_SECURE: "maybe" is not true or false: ` + words},
		{[]string{"KILN_S3_SECURE=t"}, nil, `environment KILN_S3_SECURE: "t" is not true or false: ` + words},
		{nil, []string{"--s3-secure=y"}, `flag --s3-secure: "y" is not true or false: ` + words},
		{[]string{"KILN_CONFIG=" + two}, nil, "config file " + two + `: line 2: s3_secure: "2" is not true or false: ` + words},
		{[]string{"KILN_CONFIG=" + quotedT}, nil, "config file " + quotedT + `: line 1: s3_secure: "t" is not true or false: ` + words},
		{[]string{"KILN_CONFIG=" + list}, nil, "config file " + list + ": line 1: s3_secure: " + words + ", not a list or a mapping"},
		{[]string{"KILN_REQUIRE_GPU=maybe"}, nil, `KILN_REQUIRE_GPU "maybe" is not true or false: ` + words + ", or leave it unset"},
	} {
		wantRefused(t, append(c.env, noRedis), c.want, append([]string{"config"}, c.args...)...)
	}
}
