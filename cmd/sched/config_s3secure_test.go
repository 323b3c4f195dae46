package main

import (
	"strings"
	"testing"
)

// --s3-secure alone means true, so a separate word after it was left to
// the command as an argument: "--s3-secure false" meant https and a task
// or run named "false". Such a word that reads as true or false is refused
// before any command runs, saying to write --s3-secure=false (or =true);
// the flag with '=', alone at the end, or before another flag still works.
func TestS3SecureWithASeparateBooleanWordIsRefused(t *testing.T) {
	t.Parallel()
	noRedis := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--s3-secure", "no"}, `--s3-secure no: the flag's value follows '=', so "no" here is read as an argument of the command; write --s3-secure=false`},
		{[]string{"results", "--s3-secure", "false"}, "write --s3-secure=false"},
		{[]string{"--s3-secure", "Off", "results"}, "write --s3-secure=false"},
		{[]string{"train", "--s3-secure", "FALSE", "--steps", "1"}, "write --s3-secure=false"},
		{[]string{"worker", "--s3-secure", "0"}, "write --s3-secure=false"},
		{[]string{"config", "--s3-secure", "yes"}, "write --s3-secure=true (or --s3-secure alone)"},
		{[]string{"config", "--s3-secure", "On"}, "write --s3-secure=true"},
		{[]string{"config", "--s3-secure", "1"}, "write --s3-secure=true"},
		// Every switch is read so: a bool flag of a command too.
		{[]string{"train", "--resume", "false", "--steps", "1"}, "write --resume=false"},
	} {
		wantRefused(t, noRedis, c.want, c.args...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"config", "--s3-secure=false"}, "false"},
		{[]string{"config", "--s3-secure=true"}, "true"},
		{[]string{"config", "--s3-secure"}, "true"},
		{[]string{"config", "--s3-secure", "--log-format", "json"}, "true"},
	} {
		out, errOut, code := sched(t, noRedis, c.args...)
		if code != 0 || !strings.Contains(out, "KILN_S3_SECURE       s3-secure        "+c.want+"\n") {
			t.Errorf("sched %v: exit %d, want s3-secure %s\n%s%s", c.args, code, c.want, out, errOut)
		}
	}
}
