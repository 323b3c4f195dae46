package main

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// `sched status` and `sched runs` read object storage where Redis knows
// no run (its data lost): with a wrong secret or an unknown access key
// they printed the status, "object storage not read ...:
// SignatureDoesNotMatch: check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY"
// among it, and exited 0, where every other command refuses wrong
// credentials in one line that names them and exits 2 (README). They
// still print what Redis holds, and then the one line, and exit 2; a
// watch too, after its first frame. A store that does not answer is an
// outage, not a mistake of the configuration: what Redis holds and why
// the store was not read, exit 0.
func TestStatusAndRunsExitTwoWhereObjectStorageRefusesTheKeys(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	s3 := testsvc.S3(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_S3_ENDPOINT=" + s3.Endpoint}
	wrongSecret := append(env[:len(env):len(env)], "KILN_S3_ACCESS_KEY="+s3.AccessKey, "KILN_S3_SECRET_KEY=wrong")
	unknownKey := append(env[:len(env):len(env)], "KILN_S3_ACCESS_KEY=nosuchkey", "KILN_S3_SECRET_KEY="+s3.SecretKey)
	const notRead = "object storage not read, so a run that only its checkpoints there still record is not listed: "
	for _, c := range []struct {
		env  []string
		args []string
		// out is what stdout holds: the status whole, the line about
		// object storage in it.
		out []string
	}{
		{wrongSecret, []string{"status"}, []string{"QUEUE ", "\nWORKERS\n", "\nRUNS\nno training runs in Redis", notRead, "SignatureDoesNotMatch", "\nFAILURES in the last hour\n"}},
		{wrongSecret, []string{"runs"}, []string{"RUNS\nno training runs in Redis\n" + notRead, "SignatureDoesNotMatch", "\nTASKS\n"}},
		{wrongSecret, []string{"status", "--watch", "--interval", "100ms"}, []string{"kiln status at ", "\nRUNS\nno training runs in Redis", notRead, "\nFAILURES in the last hour\n"}},
		{unknownKey, []string{"status"}, []string{"\nRUNS\nno training runs in Redis", notRead, "check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY"}},
		{unknownKey, []string{"runs"}, []string{"RUNS\nno training runs in Redis\n" + notRead, "check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY"}},
	} {
		out, errOut, code := sched(t, c.env, c.args...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 ||
			!strings.HasPrefix(errOut, "sched: object storage refused the credentials, so what only it holds is not shown above: ") ||
			!strings.HasSuffix(errOut, ": check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY\n") {
			t.Errorf("sched %v with wrong keys: exit %d, stderr %q; want exit 2 and one line naming KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY", c.args, code, errOut)
		}
		for _, want := range c.out {
			if !strings.Contains(out, want) {
				t.Errorf("sched %v with wrong keys: stdout lacks %q:\n%s", c.args, want, out)
			}
		}
		if c.args[0] == "status" && strings.Count(out, "\nRUNS\n") != 1 {
			t.Errorf("sched %v with wrong keys: want one status drawn, got:\n%s", c.args, out)
		}
	}

	// Not answering: an outage, exit 0.
	s3.Stop()
	right := append(env[:len(env):len(env)], "KILN_S3_ACCESS_KEY="+s3.AccessKey, "KILN_S3_SECRET_KEY="+s3.SecretKey)
	for _, args := range [][]string{{"status"}, {"runs"}} {
		out, errOut, code := sched(t, right, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, notRead+"cannot reach the object store at http://"+s3.Endpoint+" ") {
			t.Errorf("sched %v with object storage down: exit %d, stderr %q; want exit 0 and the line saying why it was not read:\n%s", args, code, errOut, out)
		}
	}
}
