package chaos

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pgrelay/pgrelay/internal/natsserver"
	"github.com/pgrelay/pgrelay/internal/proc"
)

// pgBinDir holds initdb and pg_ctl.
const pgBinDir = "/usr/lib/postgresql/15/bin"

// postgresCluster is a private PostgreSQL cluster in a temporary directory,
// started and restarted by the run. PostgreSQL refuses to run as root, so
// when the run is root the cluster belongs to the postgres user.
type postgresCluster struct {
	dir, logFile string
	port         int
	asUser       string // run the server binaries as this user ("" = as ourselves)
}

// startPostgres creates and starts a cluster under dir on a free port.
// fsync is off (the machine does not crash; PostgreSQL does, and the
// operating system keeps what it wrote), but synchronous_commit stays on: an
// immediate shutdown would otherwise lose commits already reported, and the
// checker would rightly call that a lost event.
func startPostgres(ctx context.Context, dir, extraConf string) (*postgresCluster, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c := &postgresCluster{dir: filepath.Join(dir, "pgdata"), logFile: filepath.Join(dir, "postgres.log"), port: port}
	if os.Geteuid() == 0 {
		c.asUser = "postgres"
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("chaos: running as root needs a postgres user to own the cluster: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		// The user must reach the data directory through every parent.
		for d := dir; d != "/" && d != "." && d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				return nil, err
			}
		}
		if err := os.MkdirAll(c.dir, 0o700); err != nil {
			return nil, err
		}
		for _, p := range []string{c.dir, c.logFile} {
			if p == c.logFile {
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					return nil, err
				}
			}
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, err
			}
		}
	}
	if out, err := c.run(ctx, "initdb", "-D", c.dir, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		return nil, fmt.Errorf("chaos: initdb: %w\n%s", err, out)
	}
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nfsync = off\nfull_page_writes = off\nmax_connections = 200\n", port) + extraConf
	f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// run runs one of the PostgreSQL server binaries, as the cluster's user.
func (c *postgresCluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	path := filepath.Join(pgBinDir, bin)
	var cmd *exec.Cmd
	if c.asUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = os.TempDir()
	return cmd.CombinedOutput()
}

func (c *postgresCluster) start(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.dir, "-l", c.logFile); err != nil {
		return fmt.Errorf("chaos: pg_ctl start: %w\n%s", err, out)
	}
	return nil
}

// restart stops the server in mode (fast: connections terminated, clean
// checkpoint; immediate: a crash, recovery at start) and starts it again.
func (c *postgresCluster) restart(ctx context.Context, mode string) error {
	if out, err := c.run(ctx, "pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", c.dir); err != nil {
		return fmt.Errorf("chaos: pg_ctl stop: %w\n%s", err, out)
	}
	return c.start(ctx)
}

func (c *postgresCluster) stop() {
	_, _ = c.run(context.Background(), "pg_ctl", "stop", "-w", "-t", "30", "-m", "immediate", "-D", c.dir)
}

// addr is the cluster's host:port.
func (c *postgresCluster) addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

// natsServer is a private NATS JetStream server that the run can restart on
// the same port and store directory.
type natsServer struct {
	mu       sync.Mutex
	srv      *server.Server
	storeDir string
	listen   string
}

func startNATS(dir string) (*natsServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &natsServer{storeDir: filepath.Join(dir, "nats"), listen: fmt.Sprintf("127.0.0.1:%d", port)}
	return n, n.start()
}

func (n *natsServer) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var err error
	for range 20 { // the port can take a moment to be free again after a restart
		if n.srv, _, err = natsserver.Start(natsserver.Config{StoreDir: n.storeDir, Listen: n.listen}); err == nil {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("chaos: start NATS on %s: %w", n.listen, err)
}

func (n *natsServer) shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// restart shuts the server down, waits down, and starts it again.
func (n *natsServer) restart(down time.Duration) error {
	n.shutdown()
	time.Sleep(down) // the outage itself
	return n.start()
}

func (n *natsServer) url() string { return "nats://" + n.listen }

// proxies are the in-process toxiproxy links the services reach PostgreSQL
// and the broker through.
type proxies struct {
	api        *toxiproxy.ApiServer
	pg, broker *toxiproxy.Proxy
	toxicSeq   int
	toxicsMux  sync.Mutex
}

func startProxies(pgAddr, brokerAddr string) (*proxies, error) {
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.New(io.Discard))
	p := &proxies{api: api}
	for _, x := range []struct {
		dst  **toxiproxy.Proxy
		name string
		up   string
	}{{&p.pg, "postgres", pgAddr}, {&p.broker, "broker", brokerAddr}} {
		px := toxiproxy.NewProxy(api, x.name, "127.0.0.1:0", x.up)
		if err := px.Start(); err != nil {
			p.stop()
			return nil, fmt.Errorf("chaos: proxy %s: %w", x.name, err)
		}
		*x.dst = px
	}
	return p, nil
}

func (p *proxies) stop() {
	for _, px := range []*toxiproxy.Proxy{p.pg, p.broker} {
		if px != nil {
			px.Stop()
		}
	}
}

// addToxic adds a toxic of type kind with attributes to px in both
// directions, and returns a function removing them.
func (p *proxies) addToxic(px *toxiproxy.Proxy, kind string, attrs string) (func(), error) {
	p.toxicsMux.Lock()
	p.toxicSeq++
	seq := p.toxicSeq
	p.toxicsMux.Unlock()
	var names []string
	remove := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			_ = px.Toxics.RemoveToxic(ctx, n)
		}
	}
	for _, dir := range []string{"upstream", "downstream"} {
		name := fmt.Sprintf("%s_%s_%d", kind, dir, seq)
		js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, dir, attrs)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			remove()
			return nil, fmt.Errorf("chaos: toxic %s on %s: %w", kind, px.Name, err)
		}
		names = append(names, name)
	}
	return remove, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// buildBinaries builds the relay and consumer into dir.
func buildBinaries(ctx context.Context, moduleRoot, dir string) error {
	if err := proc.Build(ctx, proc.BuildSpec{Dir: moduleRoot, Out: dir + string(os.PathSeparator),
		Packages: []string{"./cmd/relay", "./cmd/consumer"}}); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	return nil
}
