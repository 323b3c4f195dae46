package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/worker"
)

func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadComposeWith(nil)
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return p
}

// loadComposeWith loads compose.yaml as docker compose does, with the
// .env's three required values and extra set.
func loadComposeWith(extra types.Mapping) (*types.Project, error) {
	path, err := filepath.Abs("../../compose.yaml")
	if err != nil {
		return nil, err
	}
	env := types.Mapping{"REDIS_PASSWORD": "pw-from-env", "KILN_S3_ACCESS_KEY": "ak", "KILN_S3_SECRET_KEY": "sk-from-env"}
	for k, v := range extra {
		env[k] = v
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(path),
		ConfigFiles: []types.ConfigFile{{Filename: path}},
		Environment: env,
	}, func(o *loader.Options) { o.SetProjectName("kiln", true) })
}

// The GPU worker reserves the GPUs KILN_GPUS names: a number, or all
// (compose's -1); a word that is neither is refused when compose loads.
func TestComposeReservesKILNGPUs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		gpus string
		want int64
	}{{"", 1}, {"2", 2}, {"all", -1}} {
		extra := types.Mapping{}
		if c.gpus != "" {
			extra["KILN_GPUS"] = c.gpus
		}
		p, err := loadComposeWith(extra)
		if err != nil {
			t.Fatalf("KILN_GPUS=%q: %v", c.gpus, err)
		}
		w := p.Services["worker-gpu"]
		dev := w.Deploy.Resources.Reservations.Devices[0]
		if int64(dev.Count) != c.want {
			t.Errorf("KILN_GPUS=%q reserves %d GPUs, want %d", c.gpus, dev.Count, c.want)
		}
		// The worker trains on what it reserves.
		v := w.Environment["KILN_GPUS"]
		if v == nil {
			t.Fatalf("KILN_GPUS=%q: the GPU worker's environment has no KILN_GPUS", c.gpus)
		}
		if g, err := workerGPUs(*v); err != nil || model.GPUsString(int(g)) != map[string]string{"": "1"}[c.gpus]+c.gpus {
			t.Errorf("KILN_GPUS=%q: the GPU worker reads %q (%v)", c.gpus, *v, err)
		}
	}
	if _, err := loadComposeWith(types.Mapping{"KILN_GPUS": "two"}); err == nil {
		t.Error("KILN_GPUS=two was accepted")
	}
}

// KILN_NCCL_BUCKET_MB in .env reaches the GPU worker, whose engine takes
// it; unset, the worker gets it empty, the one all-reduce after the
// backward.
func TestComposePassesTheBucketSize(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "25"} {
		extra := types.Mapping{}
		if v != "" {
			extra["KILN_NCCL_BUCKET_MB"] = v
		}
		p, err := loadComposeWith(extra)
		if err != nil {
			t.Fatalf("KILN_NCCL_BUCKET_MB=%q: %v", v, err)
		}
		got := p.Services["worker-gpu"].Environment["KILN_NCCL_BUCKET_MB"]
		if got == nil || *got != v {
			t.Fatalf("KILN_NCCL_BUCKET_MB=%q in .env: the GPU worker gets %v", v, got)
		}
		if _, err := kernels.ParseOptions(func(k string) string { return map[string]string{"KILN_NCCL_BUCKET_MB": *got}[k] }); err != nil {
			t.Errorf("the GPU worker's engine refuses KILN_NCCL_BUCKET_MB=%q: %v", *got, err)
		}
	}
}

func TestComposeFile(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	for _, name := range []string{"redis", "minio", "asynqmon", "worker-ingest", "worker-gpu"} {
		if _, ok := p.Services[name]; !ok {
			t.Fatalf("compose.yaml has no service %s", name)
		}
	}
	ports := map[string][]uint32{"redis": {6379}, "minio": {9000, 9001}, "asynqmon": {8080}}
	for svc, want := range ports {
		var got []uint32
		for _, pc := range p.Services[svc].Ports {
			got = append(got, pc.Target)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s publishes %v, want %v", svc, got, want)
		}
	}
	for _, svc := range []string{"worker-ingest", "worker-gpu"} {
		if a := p.Services[svc].Environment["KILN_METRICS_ADDR"]; a == nil || *a != ":9400" {
			t.Errorf("%s serves no metrics (KILN_METRICS_ADDR %v, want :9400)", svc, a)
		}
	}
	for _, svc := range []string{"redis", "minio"} {
		if hc := p.Services[svc].HealthCheck; hc == nil || len(hc.Test) == 0 {
			t.Errorf("%s has no healthcheck", svc)
		}
	}
	redisCmd := strings.Join(p.Services["redis"].Command, " ")
	for _, want := range []string{"--appendonly yes", "--maxmemory-policy noeviction", `--maxmemory "$KILN_REDIS_MAXMEMORY"`} {
		if !strings.Contains(redisCmd, want) {
			t.Errorf("redis command %q lacks %q", redisCmd, want)
		}
	}
	// .env's KILN_REDIS_MAXMEMORY reaches the redis service (the default,
	// 2gb, is checked against a running server in
	// TestComposeKeepsTheRedisPasswordOffCommandLines).
	sized, err := loadComposeWith(types.Mapping{"KILN_REDIS_MAXMEMORY": "64mb"})
	if err != nil {
		t.Fatal(err)
	}
	if v := sized.Services["redis"].Environment["KILN_REDIS_MAXMEMORY"]; v == nil || *v != "64mb" {
		t.Errorf("with KILN_REDIS_MAXMEMORY=64mb in .env, redis's environment has %v", v)
	}
	gpu := p.Services["worker-gpu"]
	if gpu.Deploy == nil || gpu.Deploy.Resources.Reservations == nil || len(gpu.Deploy.Resources.Reservations.Devices) != 1 {
		t.Fatal("worker-gpu reserves no GPU device")
	}
	dev := gpu.Deploy.Resources.Reservations.Devices[0]
	if dev.Driver != "nvidia" || dev.Count != 1 || !strings.Contains(strings.Join(dev.Capabilities, ","), "gpu") {
		t.Errorf("worker-gpu device reservation %+v, want one nvidia gpu", dev)
	}
	// The kernel cache (compiled kernels, the timed GEMMs' choices) in the
	// data volume: a restarted container resumes a run with the same sums.
	if c := gpu.Environment["KILN_KERNEL_CACHE"]; c == nil || len(gpu.Volumes) == 0 || !strings.HasPrefix(*c, gpu.Volumes[0].Target+"/") {
		t.Errorf("worker-gpu keeps its kernel cache at %v, not in its data volume (%v)", c, gpu.Volumes)
	}
	// Without its GPU the worker archives runs of engine auto instead of
	// training them on the CPU.
	if r := gpu.Environment["KILN_REQUIRE_GPU"]; r == nil || *r != "1" {
		t.Errorf("worker-gpu KILN_REQUIRE_GPU %v, want 1", r)
	}
	if gpu.StopGracePeriod == nil || time.Duration(*gpu.StopGracePeriod) < 5*time.Minute {
		t.Errorf("worker-gpu stop_grace_period %v: too short to checkpoint", gpu.StopGracePeriod)
	}
	for _, name := range []string{"worker-ingest", "worker-gpu"} {
		s := p.Services[name]
		if s.Restart == "" || s.Restart == "no" {
			t.Errorf("%s has no restart policy", name)
		}
		if s.ContainerName != "" || len(s.Ports) != 0 {
			t.Errorf("%s cannot scale: it has a container name or host ports", name)
		}
		grace, err := time.ParseDuration(*s.Environment["KILN_SHUTDOWN_GRACE"])
		// The worker ends at most worker.WrapUp after the grace.
		if err != nil || s.StopGracePeriod == nil || grace+worker.WrapUp >= time.Duration(*s.StopGracePeriod) {
			t.Errorf("%s: KILN_SHUTDOWN_GRACE %v must be shorter than stop_grace_period %v by more than %v, or compose kills the drain", name, grace, s.StopGracePeriod, worker.WrapUp)
		}
		if len(s.Volumes) == 0 || s.Volumes[0].Source != "kiln-data" {
			t.Errorf("%s does not mount the kiln-data volume", name)
		}
	}
	if _, ok := p.Volumes["kiln-data"]; !ok {
		t.Error("no named volume kiln-data")
	}
}

// The Redis password is on no command line of the stack, where every user
// of the host reads it with ps: compose's redis command, run here as the
// container runs it, takes a password of any characters from its
// environment and becomes redis-server itself (the first process, which
// docker stop's SIGTERM reaches); its healthcheck authenticates from the
// environment too, and asynqmon reads the password from its own.
func TestComposeKeepsTheRedisPasswordOffCommandLines(t *testing.T) {
	t.Parallel()
	const pw = `p w'"\ $HOME ü`
	p, err := loadComposeWith(types.Mapping{"REDIS_PASSWORD": pw})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range p.Services {
		var hc []string
		if s.HealthCheck != nil {
			hc = s.HealthCheck.Test
		}
		for _, line := range [][]string{s.Command, s.Entrypoint, hc} {
			if strings.Contains(strings.Join(line, " "), "p w") {
				t.Errorf("%s has the Redis password on a command line: %q", name, line)
			}
		}
	}
	if v := p.Services["asynqmon"].Environment["REDIS_PASSWORD"]; v == nil || *v != pw {
		t.Errorf("asynqmon's environment has REDIS_PASSWORD %v, want the .env's", v)
	}

	redis := p.Services["redis"]
	if v := redis.Environment["REDIS_PASSWORD"]; v == nil || *v != pw {
		t.Fatalf("redis's environment has REDIS_PASSWORD %v, want the .env's", v)
	}
	port := freeLoopbackPort(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server on PATH (make test installs it)")
	}
	cmd := exec.Command(redis.Command[0], append(redis.Command[1:], "--port", port, "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "")...)
	// The service's environment, as docker gives it to the container.
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	for k, v := range redis.Environment {
		if v != nil {
			cmd.Env = append(cmd.Env, k+"="+*v)
		}
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	ctx := context.Background()
	authed := redisClient(t, (&url.URL{Scheme: "redis", User: url.UserPassword("", pw), Host: "127.0.0.1:" + port, Path: "/0"}).String())
	for {
		err := authed.Ping(ctx).Err()
		if err == nil {
			break
		}
		if strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), "NOAUTH") {
			t.Fatalf("the server started by compose's redis command refuses the .env's password: %v\n%s", err, out.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("compose's redis command exited (%v) before it answered:\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Bounded below the host's memory, and refusing rather than evicting
	// at the bound.
	if got, err := authed.ConfigGet(ctx, "maxmemory*").Result(); err != nil || got["maxmemory"] != "2147483648" || got["maxmemory-policy"] != "noeviction" {
		t.Errorf("compose's redis runs with %v (%v): want maxmemory 2gb (2147483648) and noeviction", got, err)
	}
	if err := redisClient(t, "redis://127.0.0.1:"+port+"/0").Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("a client without the password: %v, want NOAUTH", err)
	}
	if err := redisClient(t, "redis://:wrong@127.0.0.1:"+port+"/0").Ping(ctx).Err(); err == nil {
		t.Error("a client with a wrong password was let in")
	}
	// redis-server rewrites its command line to its title, so the
	// process's name is read as well.
	argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if name := strings.TrimSpace(string(comm)); name != "redis-server" || strings.Contains(string(argv), "p w") {
		t.Errorf("the command's process is %q running %q: want redis-server itself, without the password", name, strings.TrimRight(string(argv), "\x00"))
	}

	// The healthcheck, pointed at this server's port.
	hc := redis.HealthCheck.Test
	if len(hc) != 2 || hc[0] != "CMD-SHELL" {
		t.Fatalf("redis healthcheck %q: want one CMD-SHELL line", hc)
	}
	check := func(password string) error {
		c := exec.Command("sh", "-c", strings.Replace(hc[1], "redis-cli", "redis-cli -p "+port, 1))
		c.Env = append(os.Environ(), "REDIS_PASSWORD="+password, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
		return c.Run()
	}
	if err := check(pw); err != nil {
		t.Errorf("the healthcheck fails against the running server: %v", err)
	}
	if err := check("wrong"); err == nil {
		t.Error("the healthcheck passes with a wrong password")
	}
}

// The workers get the .env's Software Heritage settings, which the ingest
// of the-stack-v2 and python-edu reads from their environment; without
// them in .env the workers ask the bucket anonymously.
func TestComposePassesTheSoftwareHeritageSettings(t *testing.T) {
	want := types.Mapping{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "swh-secret", "AWS_SESSION_TOKEN": "swh-session",
		"AWS_REGION": "eu-west-3", "KILN_SWH_ENDPOINT": "http://swh-mirror.example"}
	p, err := loadComposeWith(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"worker-ingest", "worker-gpu"} {
		for k, v := range p.Services[name].Environment {
			if _, ok := want[k]; ok && v != nil {
				t.Setenv(k, *v)
			}
		}
		swh := ingest.SWHFromEnv()
		if got := (types.Mapping{"AWS_ACCESS_KEY_ID": swh.AccessKey, "AWS_SECRET_ACCESS_KEY": swh.SecretKey, "AWS_SESSION_TOKEN": swh.SessionToken,
			"AWS_REGION": swh.Region, "KILN_SWH_ENDPOINT": swh.Endpoint}); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s's ingest reads %v from its compose environment, want %v", name, got, want)
		}
		for k := range want {
			t.Setenv(k, "")
		}
	}
	p, err = loadComposeWith(nil)
	if err != nil {
		t.Fatal(err)
	}
	for k := range want {
		if v := p.Services["worker-ingest"].Environment[k]; v == nil || *v != "" {
			t.Errorf("without it in .env, worker-ingest's %s is %v, want empty (anonymous, the default bucket)", k, v)
		}
	}
}

// The stack's ports are published on 127.0.0.1 unless KILN_BIND names
// another address: asynqmon asks for no login, and Redis and MinIO only
// for their passwords.
func TestComposePublishesOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ bind, want string }{{"", "127.0.0.1"}, {"0.0.0.0", "0.0.0.0"}, {"10.1.2.3", "10.1.2.3"}} {
		extra := types.Mapping{}
		if c.bind != "" {
			extra["KILN_BIND"] = c.bind
		}
		p, err := loadComposeWith(extra)
		if err != nil {
			t.Fatal(err)
		}
		for name, s := range p.Services {
			for _, pc := range s.Ports {
				if pc.HostIP != c.want {
					t.Errorf("KILN_BIND=%q: %s publishes port %d on %q, want %q", c.bind, name, pc.Target, pc.HostIP, c.want)
				}
			}
		}
	}
}

// freeLoopbackPort is a loopback port nothing listens on.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// redisClient is a go-redis client of url, closed when the test ends.
func redisClient(t *testing.T, u string) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestComposeWorkersRunLocally starts each worker service's command with
// its compose environment, pointed at a local redis-server and versitygw
// instead of the compose hosts, and gets a task through each.
func TestComposeWorkersRunLocally(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	r := testsvc.StartRedis(t)
	s3 := testsvc.S3(t)
	local := map[string]string{
		"KILN_REDIS_URL":     r.URL(0),
		"KILN_S3_ENDPOINT":   s3.Endpoint,
		"KILN_S3_ACCESS_KEY": s3.AccessKey,
		"KILN_S3_SECRET_KEY": s3.SecretKey,
		"KILN_DATA_DIR":      t.TempDir(),
		// Both workers run on this host: each takes a free port.
		"KILN_METRICS_ADDR": "127.0.0.1:0",
	}
	var env []string
	for _, name := range []string{"worker-ingest", "worker-gpu"} {
		s := p.Services[name]
		if len(s.Command) == 0 || s.Command[0] != "worker" {
			t.Fatalf("%s command %v does not run `sched worker`", name, s.Command)
		}
		var senv []string
		for k, v := range s.Environment {
			if lv, ok := local[k]; ok {
				senv = append(senv, k+"="+lv)
			} else if v != nil {
				senv = append(senv, k+"="+*v)
			}
		}
		env = senv
		cmd := exec.Command(os.Args[0], s.Command...)
		cmd.Env = append(baseEnv(t), senv...)
		logf, _ := os.Create(filepath.Join(t.TempDir(), name+".log"))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%s", name, b)
			}
		})
	}
	// The environment of a compose worker also works for the CLI: S3 reachable
	// with the local credentials, Redis reachable. It is the GPU worker's,
	// which requires a GPU: without one the check says so and fails.
	out, errOut, code := sched(t, env, "config", "--check")
	if !strings.Contains(out, "redis and object store reachable") {
		t.Fatalf("config --check with the worker environment: %d %s %s", code, out, errOut)
	}
	if gpu := cuda.Devices() > 0; gpu != (code == 0) || !gpu && !strings.Contains(errOut, "KILN_REQUIRE_GPU") {
		t.Fatalf("config --check with the GPU worker's environment, GPU here %v: exit %d %s", gpu, code, errOut)
	}
	opt, _ := asynq.ParseRedisURI(r.URL(0))
	q := scheduler.NewClient(opt)
	defer q.Close()
	ctx := context.Background()
	var ids []string
	info, err := q.Enqueue(ctx, scheduler.BenchRun{Model: "tiny", Engine: "cpu", Params: map[string]string{"batch": "1", "seq": "16", "steps": "2", "warmup": "0"}})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, info.ID)
	// ingest and append: a kind no build knows proves each queue is served
	// (its worker archives the task with the clear error), without running
	// a real ingest.
	raw := asynq.NewClient(opt)
	defer raw.Close()
	var probes []string
	for _, queue := range []string{scheduler.QueueIngest, scheduler.QueueAppend} {
		info, err := raw.Enqueue(asynq.NewTask("probe:"+queue, []byte("{}"), asynq.Queue(queue)))
		if err != nil {
			t.Fatal(err)
		}
		probes = append(probes, info.ID)
	}
	for _, id := range ids {
		waitStatus(t, env, id, regexp.MustCompile(`completed`), time.Minute)
	}
	for _, id := range probes {
		waitStatus(t, env, id, regexp.MustCompile(`archived.*unknown task kind`), time.Minute)
	}
}

// The GPU worker reads KILN_GPUS as compose passes it: a run that names no
// gpus trains on that many; anything else stops the worker in one line.
func TestWorkerGPUsFromTheEnvironment(t *testing.T) {
	for v, want := range map[string]trainer.GPUCount{"": 0, "1": 1, "2": 2, "all": trainer.GPUCount(model.AllGPUs)} {
		if got, err := workerGPUs(v); err != nil || got != want {
			t.Errorf("KILN_GPUS=%q: %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"two", "0", "-1"} {
		if _, err := workerGPUs(v); err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "KILN_GPUS") {
			t.Errorf("KILN_GPUS=%q: %v; want bad input naming KILN_GPUS", v, err)
		}
	}
}

// KILN_REQUIRE_GPU is yes or no; a worker given anything else stops at
// start in one line that names the setting, before it takes a task.
func TestWorkerRequireGPUFromTheEnvironment(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "1": true, "true": true} {
		t.Setenv("KILN_REQUIRE_GPU", v)
		if got, err := envBool("KILN_REQUIRE_GPU"); err != nil || got != want {
			t.Errorf("KILN_REQUIRE_GPU=%q: %v, %v; want %v", v, got, err, want)
		}
	}
	redis := testsvc.Redis(t)
	_, errOut, code := sched(t, []string{"KILN_REQUIRE_GPU=maybe", "KILN_REDIS_URL=redis://" + redis + "/0"}, "worker", "--queues", "gpu=1")
	if code != 2 || !strings.Contains(errOut, `KILN_REQUIRE_GPU "maybe"`) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Errorf("KILN_REQUIRE_GPU=maybe: exit %d, %q; want exit 2 and one line naming it", code, errOut)
	}
}

// The GPU worker's runs file is KILN_WORKER_RUNS of .env, passed on as its
// KILN_RUNS (a path in its data volume, not the host's KILN_RUNS); unset,
// the worker has the presets only.
func TestComposePassesTheWorkersRunsFile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ set, want string }{{"", ""}, {"/data/runs.yaml", "/data/runs.yaml"}} {
		extra := types.Mapping{"KILN_RUNS": "/home/me/runs.yaml"}
		if c.set != "" {
			extra["KILN_WORKER_RUNS"] = c.set
		}
		p, err := loadComposeWith(extra)
		if err != nil {
			t.Fatal(err)
		}
		if v := p.Services["worker-gpu"].Environment["KILN_RUNS"]; v == nil || *v != c.want {
			t.Errorf("KILN_WORKER_RUNS=%q: the GPU worker's KILN_RUNS is %v, want %q", c.set, v, c.want)
		}
	}
}

// operations.md's excerpt of compose.yaml in "Compose: grace periods and
// restart policies" is compose.yaml's: each command (words left out where
// the excerpt says "..."), environment value, stop grace, restart policy
// and volume it shows; and the systemd settings it gives a GPU worker
// outside compose are compose's grace and stop grace.
func TestOperationsComposeExcerptIsComposes(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Compose: grace periods and restart policies\n")
	if !ok {
		t.Fatal("docs/operations.md has no section \"Compose: grace periods and restart policies\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, excerpt, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("operations.md's compose section has no yaml excerpt")
	}
	excerpt, _, _ = strings.Cut(excerpt, "```")
	var doc struct {
		Services map[string]struct {
			Command         []string          `yaml:"command"`
			Environment     map[string]string `yaml:"environment"`
			StopGracePeriod string            `yaml:"stop_grace_period"`
			Restart         string            `yaml:"restart"`
			Volumes         []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(excerpt), &doc); err != nil {
		t.Fatalf("operations.md's compose excerpt: %v", err)
	}
	p := loadCompose(t)
	shown := 0
	for name, e := range doc.Services {
		s, ok := p.Services[name]
		if !ok {
			t.Errorf("operations.md shows service %s, which compose.yaml has not", name)
			continue
		}
		if len(e.Command) > 0 {
			shown++
			want := strings.Fields(strings.Join(e.Command, " "))
			got := strings.Fields(strings.Join(s.Command, " "))
			if !strings.Contains(strings.Join(e.Command, " "), "...") {
				if !slices.Equal(got, want) {
					t.Errorf("operations.md shows %s's command %q; compose.yaml's is %q", name, e.Command, s.Command)
				}
			} else if !subsequence(slices.DeleteFunc(want, func(w string) bool { return w == "..." }), got) {
				t.Errorf("operations.md shows %s's command %q; compose.yaml's, %q, does not say those words in that order", name, e.Command, s.Command)
			}
		}
		for k, v := range e.Environment {
			shown++
			if got := s.Environment[k]; got == nil {
				t.Errorf("operations.md shows %s's %s: %s; compose.yaml sets none", name, k, v)
			} else if *got != v {
				t.Errorf("operations.md shows %s's %s: %s; compose.yaml's is %s", name, k, v, *got)
			}
		}
		if e.StopGracePeriod != "" {
			shown++
			d, err := time.ParseDuration(e.StopGracePeriod)
			if err != nil || s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) != d {
				t.Errorf("operations.md shows %s's stop_grace_period: %s; compose.yaml's is %v", name, e.StopGracePeriod, s.StopGracePeriod)
			}
		}
		if e.Restart != "" {
			shown++
			if s.Restart != e.Restart {
				t.Errorf("operations.md shows %s's restart: %s; compose.yaml's is %q", name, e.Restart, s.Restart)
			}
		}
		for _, v := range e.Volumes {
			shown++
			source, target, _ := strings.Cut(v, ":")
			if !slices.ContainsFunc(s.Volumes, func(sv types.ServiceVolumeConfig) bool { return sv.Source == source && sv.Target == target }) {
				t.Errorf("operations.md shows %s's volume %s; compose.yaml's are %v", name, v, s.Volumes)
			}
		}
	}
	if shown < 8 {
		t.Fatalf("operations.md's compose excerpt shows %d settings; it shows more:\n%s", shown, excerpt)
	}

	// Outside compose, the GPU worker's systemd unit: compose's grace, and
	// its stop grace as TimeoutStopSec.
	gpu := p.Services["worker-gpu"]
	m := regexp.MustCompile("`KILN_SHUTDOWN_GRACE=([^`]+)`,\\s+`TimeoutStopSec=(\\d+)`").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("operations.md no longer gives a GPU worker's KILN_SHUTDOWN_GRACE and TimeoutStopSec outside compose")
	}
	if g := gpu.Environment["KILN_SHUTDOWN_GRACE"]; g == nil || *g != m[1] {
		t.Errorf("operations.md gives a GPU worker outside compose KILN_SHUTDOWN_GRACE=%s; compose's is %q", m[1], gpu.Environment.ToMapping()["KILN_SHUTDOWN_GRACE"])
	}
	if stop, _ := strconv.Atoi(m[2]); gpu.StopGracePeriod == nil || time.Duration(stop)*time.Second != time.Duration(*gpu.StopGracePeriod) {
		t.Errorf("operations.md gives a GPU worker outside compose TimeoutStopSec=%s; compose's stop_grace_period is %v", m[2], gpu.StopGracePeriod)
	}
}

// subsequence says whether want's words come in got in their order.
func subsequence(want, got []string) bool {
	for _, g := range got {
		if len(want) > 0 && g == want[0] {
			want = want[1:]
		}
	}
	return len(want) == 0
}

// The workers get .env's HF_ENDPOINT and HF_TOKEN, which their Hub client
// reads; without them in .env, the Hub itself, asked without a token.
func TestComposePassesTheHubSettings(t *testing.T) {
	want := types.Mapping{"HF_ENDPOINT": "https://hub-mirror.example", "HF_TOKEN": "hf_from_env"}
	for _, set := range []bool{true, false} {
		extra := types.Mapping{}
		if set {
			extra = want
		}
		p, err := loadComposeWith(extra)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"worker-ingest", "worker-gpu"} {
			env := p.Services[name].Environment.ToMapping()
			t.Setenv("HUGGING_FACE_HUB_TOKEN", "")
			for k := range want {
				t.Setenv(k, env[k])
			}
			// The token as the worker's configuration reads it.
			_, token := envSetting("HF_TOKEN")
			hc := hubConfig(scheduler.Config{HFToken: token})
			h, err := hub.New(hc)
			if err != nil {
				t.Fatalf("%s's Hub client, .env's settings given %v: %v", name, set, err)
			}
			got := types.Mapping{"HF_ENDPOINT": h.Endpoint(), "HF_TOKEN": hc.Token}
			wantNow := want
			if !set {
				wantNow = types.Mapping{"HF_ENDPOINT": hub.DefaultEndpoint, "HF_TOKEN": ""}
			}
			if fmt.Sprint(got) != fmt.Sprint(wantNow) {
				t.Errorf("%s, .env's settings given %v: its Hub client reads %v, want %v", name, set, got, wantNow)
			}
		}
	}
}
