package scheduler

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"
)

// A run's loss names its step only while the loss is still the one
// written with that step. A kiln older than loss_step that goes on with a
// run (a worker downgraded by mistake) writes the loss alone: the state
// kept the step of the newer kiln's last loss, and the run read "loss
// 4.4250 at step 571" at step 1500. The state is written here through
// the run's lock, field for field as each build writes it.
func TestALossWrittenByAnOlderKilnNamesNoStaleStep(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	write := func(run string, f map[string]string) {
		t.Helper()
		l, err := AcquireRun(ctx, rdb, run, "gpu-a", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		if err := l.Fenced(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	// A logged step's write, as this kiln writes it, and the write of the
	// segment's end, which stopped at step after the last logged one,
	// lossStep.
	newer := func(step int, loss float64) map[string]string {
		f := map[string]string{"step": strconv.Itoa(step), "total": "1500"}
		maps.Copy(f, LossFields(loss, step))
		return f
	}
	newerEnd := func(step, lossStep int, loss float64) map[string]string {
		f := newer(step, loss)
		f["loss_step"] = strconv.Itoa(lossStep)
		return f
	}
	// A write of a kiln older than loss_step: the loss alone.
	older := func(step int, loss string) map[string]string {
		return map[string]string{"step": strconv.Itoa(step), "total": "1500", "loss": loss}
	}
	// A write of the kiln that wrote loss_step alone.
	stepOnly := func(step, lossStep int, loss string) map[string]string {
		return map[string]string{"step": strconv.Itoa(step), "total": "1500", "loss": loss, "loss_step": strconv.Itoa(lossStep)}
	}
	for _, c := range []struct {
		name   string
		writes []map[string]string
		want   string
		at     int
	}{
		{"downgraded after a segment that stopped between logged steps", []map[string]string{newer(570, 4.1), newerEnd(575, 571, 4.1234), older(1500, "4.4250")},
			"dn: step 1500/1500, loss 4.4250, no checkpoint yet", 1500},
		{"downgraded after a logged step", []map[string]string{newer(571, 4.1234), older(900, "4.3000")},
			"dn: step 900/1500, loss 4.3000, no checkpoint yet", 900},
		{"a segment that stopped between logged steps", []map[string]string{newer(570, 4.1), newerEnd(575, 571, 4.1234)},
			"dn: step 575/1500, loss 4.1234 at step 571, no checkpoint yet", 571},
		{"upgraded again", []map[string]string{newer(571, 4.1234), older(900, "4.3000"), newerEnd(905, 902, 4.2900)},
			"dn: step 905/1500, loss 4.2900 at step 902, no checkpoint yet", 902},
		{"older kiln alone", []map[string]string{older(1000, "3.1889")},
			"dn: step 1000/1500, loss 3.1889, no checkpoint yet", 1000},
		{"loss_step written alone", []map[string]string{stepOnly(1000, 995, "3.1889")},
			"dn: step 1000/1500, loss 3.1889 at step 995, no checkpoint yet", 995},
		{"loss cleared, then an older kiln's", []map[string]string{newer(571, 4.1234), NoLoss(), older(900, "4.3000")},
			"dn: step 900/1500, loss 4.3000, no checkpoint yet", 900},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := rdb.Del(ctx, RunStateKey("dn")).Err(); err != nil {
				t.Fatal(err)
			}
			for _, f := range c.writes {
				write("dn", f)
			}
			st, ok, err := ReadRunState(ctx, rdb, "dn")
			if err != nil || !ok {
				t.Fatalf("read the state: %v (found %v)", err, ok)
			}
			if got := st.String(); got != c.want || st.LossAt() != c.at {
				h, _ := rdb.HGetAll(ctx, RunStateKey("dn")).Result()
				t.Errorf("state %v reads %q, its loss of step %d; want %q, of step %d", h, got, st.LossAt(), c.want, c.at)
			}
		})
	}
}
