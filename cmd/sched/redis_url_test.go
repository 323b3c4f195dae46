package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A Redis URL reaches Redis as it is written or is refused naming what is
// wrong: its user name (an ACL user) is used, where only the password was,
// as the default user's; options after '?' are refused by their names
// (a value may be a password, which sched config printed); and a password
// holding '/', '?' or '#' is told to be percent-encoded, where the URL was
// said to have a port that is not a number.
func TestARedisURLIsReadAsItIsWritten(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	if err := rdb.Do(context.Background(), "ACL", "SETUSER", "bob", "on", ">bobpw", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_REDIS_URL=redis://bob:bobpw@" + r.Addr + "/0"}
	if out, errOut, code := sched(t, env, "status"); code != 0 || !strings.Contains(out, "WORKERS\n") {
		t.Fatalf("status as the ACL user bob: exit %d\n%s%s", code, out, errOut)
	}
	// Reached and refused is said so, not "cannot reach Redis".
	wantRefused(t, []string{"KILN_REDIS_URL=redis://bob:wrongpw@" + r.Addr + "/0"}, "Redis at redis://bob:xxxxx@"+r.Addr+"/0 (KILN_REDIS_URL or --redis-url) refused its credentials: WRONGPASS", "status")
	wantRefused(t, []string{"KILN_REDIS_URL=redis://" + r.Addr + "/0"}, "refused its credentials: NOAUTH", "status")
	for _, c := range []struct{ url, want string }{
		{"redis://" + r.Addr + "/0?password=s3cretpass&db=2", `KILN_REDIS_URL: "redis://` + r.Addr + `" has options after '?' (db, password), which kiln does not read: remove it; a password goes before the host`},
		{"redis://" + r.Addr + "/0#frag", "has a part after '#', which kiln does not read"},
		{"redis://:pw/s3cretpass@" + r.Addr + "/0", "its password holds '/', '?' or '#', which end the host part: percent-encode them (%2F, %3F, %23)"},
	} {
		wantRefused(t, []string{"KILN_REDIS_URL=" + c.url}, c.want, "config")
		if _, errOut, _ := sched(t, []string{"KILN_REDIS_URL=" + c.url}, "config"); strings.Contains(errOut, "s3cretpass") {
			t.Errorf("sched config of %s showed the password: %s", c.url, errOut)
		}
	}
}
