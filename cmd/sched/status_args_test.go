package main

import (
	"testing"
)

// `sched status a b` got cobra's own "accepts at most 1 arg(s), received
// 2", and `sched status --s3-secure ""` its empty task id, where every
// other command says what it expects and what it got, and how a switch
// takes its value. An empty word, typed after a switch, is its value.
func TestStatusArgumentsAreRefusedAsEveryCommandsAre(t *testing.T) {
	t.Parallel()
	noRedis := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "a", "b"}, `sched status expects at most one task id (none for the whole status) (got 2: ["a" "b"]); see 'sched status --help'`},
		{[]string{"status", "--s3-secure", ""}, `--s3-secure "": the flag's value follows '=', so "" here is read as an argument of 'sched status', which expects at most one task id (none for the whole status); write --s3-secure=<value> (true or false; --s3-secure alone is true) (see 'sched status --help')`},
		{[]string{"status", "--watch", ""}, `--watch "": the flag's value follows '=', so "" here is read as an argument of 'sched status'`},
		{[]string{"status", "x", "--s3-secure", "maybe"}, `--s3-secure maybe: the flag's value follows '=', so "maybe" here is read as an argument of 'sched status', which expects at most one task id`},
		{[]string{"runs", "--s3-secure", ""}, `--s3-secure "": the flag's value follows '=', so "" here is read as an argument of 'sched runs', which expects no arguments`},
		{[]string{"cancel", "--s3-secure", ""}, `--s3-secure "": the flag's value follows '=', so "" here is read as an argument of 'sched cancel', which expects one task id`},
		// Not after a switch: the command's own word for it.
		{[]string{"status", ""}, `sched status "": the task id is empty`},
	} {
		wantRefused(t, noRedis, c.want, c.args...)
	}
}
