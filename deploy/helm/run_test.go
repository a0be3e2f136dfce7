package helm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"sigs.k8s.io/yaml"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestRenderedPodsRun runs what the chart renders with its defaults as the
// cluster would, but as local processes: the migration Job's container on an
// empty database (it must exit 0), then the relay's and the consumer's with
// exactly their pods' environment (the Secret's keys resolved from the
// rendered Secret). Their readiness and liveness probes must answer 200 on
// the port and path the pod spec names, an outbox row written with SQL must
// reach the ledger (the default handler), and on SIGTERM each must exit 0
// within its terminationGracePeriodSeconds.
func TestRenderedPodsRun(t *testing.T) {
	dbURL := emptyDatabase(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	// The test's own stream, subjects and ports; no admin API (its default
	// loopback ports could be taken on a shared machine).
	values := fmt.Sprintf(`
secret: {data: {DATABASE_URL: %q, NATS_URL: %q}}
relay: {metricsPort: %d, env: {RELAY_STREAM: %s, RELAY_SUBJECT_PREFIX: %s, ADMIN_ADDR: "", LOG_FORMAT: console}}
consumer: {metricsPort: %d, env: {CONSUMER_STREAM: %s, CONSUMER_SUBJECT_PREFIX: %s, ADMIN_ADDR: "", LOG_FORMAT: console}}
`, dbURL, natsURL, freePort(t), stream, prefix, freePort(t), stream, prefix)
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	objs := render(t, vals)
	secret := map[string]string{}
	for _, o := range objs {
		if s, ok := o.obj.(*corev1.Secret); ok {
			secret = s.StringData
		}
	}

	for _, o := range objs {
		if j, ok := o.obj.(*batchv1.Job); ok {
			c := j.Spec.Template.Spec.Containers[0]
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := podCommand(ctx, t, c, secret)
			out, err := cmd.CombinedOutput()
			cancel()
			if err != nil {
				t.Fatalf("Job %s: %v %v: %v\n%s", j.Name, c.Command, c.Args, err, out)
			}
		}
	}

	type running struct {
		d      *appsv1.Deployment
		cmd    *exec.Cmd
		out    *bytes.Buffer
		exited chan struct{} // closed when the process has exited, err set
		err    error
	}
	var pods []*running
	for _, o := range objs {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		cmd := podCommand(context.Background(), t, c, secret)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("Deployment %s: %v", d.Name, err)
		}
		p := &running{d: d, cmd: cmd, out: &out, exited: make(chan struct{})}
		go func() { p.err = cmd.Wait(); close(p.exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.exited })
		pods = append(pods, p)
	}
	if len(pods) != 2 {
		t.Fatalf("want the relay's and the consumer's Deployment, got %d", len(pods))
	}
	for _, p := range pods {
		c := p.d.Spec.Template.Spec.Containers[0]
		for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
			u := fmt.Sprintf("http://127.0.0.1:%d%s", containerPort(c, probe.HTTPGet.Port), probe.HTTPGet.Path)
			if err := waitOK(u, time.Minute, p.exited); err != nil {
				t.Fatalf("Deployment %s: probe %s: %v\n%s", p.d.Name, u, err, p.out)
			}
		}
	}

	order := "o-helm-" + randomHex()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	payload := fmt.Sprintf(`{"order_id":%q,"customer_id":"c-1","amount_cents":1250,"currency":"EUR"}`, order)
	if _, err := conn.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, event_type, payload) VALUES ('orders', $1, 'OrderCreated', convert_to($2, 'UTF8'))`, order, payload); err != nil {
		t.Fatal(err)
	}
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM ledger_orders WHERE order_id = $1`, order).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("order %s never reached the ledger\nrelay and consumer output:\n%s\n%s", order, pods[0].out, pods[1].out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	for _, p := range pods {
		grace := time.Duration(*p.d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
		start := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.exited:
			if p.err != nil {
				t.Errorf("Deployment %s: exit after SIGTERM: %v\n%s", p.d.Name, p.err, p.out)
			}
			t.Logf("Deployment %s: stopped %s after SIGTERM (grace %s)", p.d.Name, time.Since(start).Round(time.Millisecond), grace)
		case <-time.After(grace):
			t.Errorf("Deployment %s: still running %s after SIGTERM, its terminationGracePeriodSeconds\n%s", p.d.Name, grace, p.out)
		}
	}
}

// podCommand is the container's command with exactly its pod's environment
// (nothing of the test's): literal values, and secretKeyRefs resolved from
// the rendered Secret (an optional key it lacks is left unset, as the
// kubelet does).
func podCommand(ctx context.Context, t *testing.T, c corev1.Container, secret map[string]string) *exec.Cmd {
	t.Helper()
	env := []string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secret[ref.Key]
			if !ok {
				if ref.Optional == nil || !*ref.Optional {
					t.Fatalf("container %s: the Secret has no key %s, which is not optional", c.Name, ref.Key)
				}
				continue
			}
			env = append(env, e.Name+"="+v)
		default:
			t.Fatalf("container %s: %s from %+v", c.Name, e.Name, e.ValueFrom)
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), filepath.Base(c.Command[0])), c.Args...)
	cmd.Env = env
	return cmd
}

// waitOK waits for a 200 from u, for at most timeout, unless the process
// serving it exits.
func waitOK(u string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 3 * time.Second}
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("the process exited; last: %s", last)
		default:
		}
		resp, err := client.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("no 200 within %s; last: %s", timeout, last)
}

// emptyDatabase creates a database with nothing in it (the migration Job's
// to migrate) on the tests' server, dropped when the test ends.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	server := testdb.ServerURL(t)
	name := "pgrelay_helm_" + randomHex()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Logf("drop %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
	})
	return pgurl.WithDatabase(server, name)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
