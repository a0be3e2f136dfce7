package chaos

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
)

// BrokerNATSCluster is a run on a private three-node NATS JetStream cluster
// (nats-server processes on loopback, routes between them) with the stream
// replicated on all three; its faults kill -9 one node at a time, the stream
// leader among them, and restart it.
const BrokerNATSCluster = "nats-cluster"

// natsServerBin is the nats-server binary the cluster runs.
const natsServerBin = "/usr/sbin/nats-server"

// natsNode is one nats-server process of the cluster.
type natsNode struct {
	name       string
	clientPort int
	conf       string
	logFile    string
	cmd        *exec.Cmd
	done       chan struct{}
}

// natsCluster is three nats-server processes on loopback, each with its own
// store directory, routed to one another.
type natsCluster struct {
	mu    sync.Mutex
	nodes []*natsNode
}

// startNATSCluster writes the three nodes' configurations under dir and
// starts them.
func startNATSCluster(dir string) (*natsCluster, error) {
	const n = 3
	client, route := make([]int, n), make([]int, n)
	for i := range n {
		var err error
		if client[i], err = freePort(); err != nil {
			return nil, err
		}
		if route[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", route[i]))
	}
	c := &natsCluster{}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		store := filepath.Join(dir, "nats-"+name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
cluster {
  name: chaos
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, name, client[i], store, route[i], strings.Join(routes, ", "))
		path := filepath.Join(dir, "nats-"+name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &natsNode{name: name, clientPort: client[i], conf: path, logFile: filepath.Join(dir, "nats-"+name+".log")})
	}
	for _, nd := range c.nodes {
		if err := nd.start(); err != nil {
			c.shutdown()
			return nil, err
		}
	}
	for _, nd := range c.nodes {
		if err := nd.waitListening(30 * time.Second); err != nil {
			c.shutdown()
			return nil, err
		}
	}
	return c, nil
}

// waitListening waits until the node accepts client connections.
func (nd *natsNode) waitListening(timeout time.Duration) error {
	addr := fmt.Sprintf("127.0.0.1:%d", nd.clientPort)
	for end := time.Now().Add(timeout); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("chaos: nats-server %s does not listen on %s (log %s): %w", nd.name, addr, nd.logFile, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (nd *natsNode) start() error {
	log, err := os.OpenFile(nd.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(natsServerBin, "-c", nd.conf)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("chaos: start nats-server %s: %w", nd.name, err)
	}
	nd.cmd, nd.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); log.Close(); close(done) }(nd.done)
	return nil
}

// kill sends SIGKILL to the node and waits for it to exit.
func (nd *natsNode) kill() {
	if nd.cmd == nil {
		return
	}
	_ = nd.cmd.Process.Kill()
	<-nd.done
	nd.cmd = nil
}

func (nd *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort) }

// urls returns every node's client URL, comma-separated, as the services
// take them.
func (c *natsCluster) urls() string {
	var u []string
	for _, nd := range c.nodes {
		u = append(u, nd.url())
	}
	return strings.Join(u, ",")
}

func (c *natsCluster) node(name string) *natsNode {
	for _, nd := range c.nodes {
		if nd.name == name {
			return nd
		}
	}
	return nil
}

// restart kills nd with SIGKILL, keeps it down for down, and starts it
// again on the same ports and store.
func (c *natsCluster) restart(nd *natsNode, down time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd.kill()
	time.Sleep(down)
	return nd.start()
}

func (c *natsCluster) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nd := range c.nodes {
		nd.kill()
	}
}

// natsClusterEnv is the brokerEnv of a BrokerNATSCluster run. The services
// reach every node directly (no proxy: the faults are the nodes' deaths).
type natsClusterEnv struct {
	natsEnv
	cluster *natsCluster
}

func startNATSClusterEnv(ctx context.Context, work string) (*natsClusterEnv, error) {
	cl, err := startNATSCluster(work)
	if err != nil {
		return nil, err
	}
	e := &natsClusterEnv{cluster: cl}
	if e.nc, err = nats.Connect(cl.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond)); err != nil {
		cl.shutdown()
		return nil, err
	}
	if e.js, err = jetstream.New(e.nc); err != nil {
		e.close()
		return nil, err
	}
	// The cluster elects its JetStream meta leader first: retry until the
	// replicated stream can be created.
	spec := pgnats.StreamSpec{Name: streamName, SubjectPrefix: subjectPrefix, Replicas: 3}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = e.js.CreateStream(cctx, spec.Config())
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || sleepCtx(ctx, 500*time.Millisecond) != nil {
			e.close()
			return nil, fmt.Errorf("chaos: create the replicated stream: %w", err)
		}
	}
	if _, err := e.waitHealthy(ctx, 60*time.Second); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *natsClusterEnv) label() string { return "NATS cluster" }
func (e *natsClusterEnv) upstream() string {
	return strings.TrimPrefix(e.cluster.nodes[0].url(), "nats://")
}
func (e *natsClusterEnv) close() { e.nc.Close(); e.cluster.shutdown() }

func (e *natsClusterEnv) serviceEnv(string) (relay, consumer []string) {
	return []string{"NATS_URL=" + e.cluster.urls(), "RELAY_STREAM=" + streamName, "RELAY_SUBJECT_PREFIX=" + subjectPrefix,
			"RELAY_ACK_TIMEOUT=3s"},
		[]string{"NATS_URL=" + e.cluster.urls(), "CONSUMER_STREAM=" + streamName, "CONSUMER_SUBJECT_PREFIX=" + subjectPrefix,
			"CONSUMER_DURABLE=" + durable, "CONSUMER_ACK_WAIT=3s"}
}

// restart (the generic broker fault) kills a random node.
func (e *natsClusterEnv) restart(_ context.Context, down time.Duration) error {
	return e.cluster.restart(e.cluster.nodes[mrand.IntN(len(e.cluster.nodes))], down)
}

// streamCluster returns the stream's cluster information.
func (e *natsClusterEnv) streamCluster(ctx context.Context) (*jetstream.ClusterInfo, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, streamName)
	if err != nil {
		return nil, 0, err
	}
	info := st.CachedInfo()
	if info.Cluster == nil {
		return nil, 0, errors.New("chaos: the stream has no cluster information")
	}
	return info.Cluster, info.State.LastSeq, nil
}

// waitHealthy waits until the stream has a leader and both other replicas
// are current, and returns the leader.
func (e *natsClusterEnv) waitHealthy(ctx context.Context, timeout time.Duration) (string, error) {
	end := time.Now().Add(timeout)
	var last error
	for time.Now().Before(end) {
		ci, _, err := e.streamCluster(ctx)
		if err == nil {
			current := 0
			for _, p := range ci.Replicas {
				if p.Current && !p.Offline {
					current++
				}
			}
			if ci.Leader != "" && current == 2 {
				return ci.Leader, nil
			}
			last = fmt.Errorf("leader %q, %d of 2 replicas current", ci.Leader, current)
		} else {
			last = err
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("chaos: the replicated stream is not healthy after %s: %v", timeout, last)
}

// killNode kills one node (the stream leader when leader is true, else a
// random follower), keeps it down for down, restarts it and waits until the
// stream is whole again. It measures the stall: the time from the kill
// until the stream's last sequence moves again (the producer keeps
// writing, so it moves as soon as the relays can publish).
func (e *natsClusterEnv) killNode(ctx context.Context, rng *mrand.Rand, leader bool, down time.Duration) (string, time.Duration, error) {
	lead, err := e.waitHealthy(ctx, 30*time.Second)
	if err != nil {
		return "", 0, err
	}
	victim := e.cluster.node(lead)
	if victim == nil {
		return "", 0, fmt.Errorf("chaos: unknown stream leader %q", lead)
	}
	if !leader {
		var followers []*natsNode
		for _, nd := range e.cluster.nodes {
			if nd != victim {
				followers = append(followers, nd)
			}
		}
		victim = followers[rng.IntN(len(followers))]
	}
	_, before, err := e.streamCluster(ctx)
	if err != nil {
		return "", 0, err
	}
	killed := time.Now()
	stall := make(chan time.Duration, 1)
	go func() {
		for time.Since(killed) < 30*time.Second && ctx.Err() == nil {
			// A short timeout: a request lost with the killed node must
			// not stretch the measure.
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, seq, err := e.streamCluster(pctx)
			cancel()
			if err == nil && seq > before {
				stall <- time.Since(killed)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		stall <- -1
	}()
	if err := e.cluster.restart(victim, down); err != nil {
		return "", 0, err
	}
	newLead, err := e.waitHealthy(ctx, 45*time.Second)
	if err != nil {
		return "", 0, err
	}
	s := <-stall
	role := "follower"
	if leader {
		role = "stream leader"
	}
	return fmt.Sprintf("SIGKILL node %s (%s), restarted after %s; stream writes resumed %s after the kill; leader now %s",
		victim.name, role, down.Round(time.Millisecond), s.Round(time.Millisecond), newLead), s, nil
}

// readLog reads the stream message by message, by sequence, from its
// leader (each request bounded and retried): an ordered consumer on a
// cluster whose nodes just restarted can stall past the checker's deadline.
func (e *natsClusterEnv) readLog(ctx context.Context) ([]streamMsg, error) {
	if _, err := e.waitHealthy(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	var st jetstream.Stream
	var info *jetstream.StreamInfo
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		if st, err = e.js.Stream(ctx, streamName); err == nil {
			info, err = st.Info(ctx)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: stream %s: %w", streamName, err)
	}
	out := make([]streamMsg, 0, info.State.Msgs)
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		var m *jetstream.RawStreamMsg
		err := retry(ctx, func(ctx context.Context) error {
			var err error
			m, err = st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				m, err = nil, nil
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("chaos: read stream message %d: %w", seq, err)
		}
		if m == nil {
			continue
		}
		out = append(out, streamMsg{seq: m.Sequence, msgID: m.Header.Get(pgnats.MsgIDHeader),
			eventID: m.Header.Get(event.HeaderEventID), key: m.Header.Get(event.HeaderKey)})
	}
	return out, nil
}

// retry calls f with a 5s timeout up to 5 times, until it succeeds.
func retry(ctx context.Context, f func(context.Context) error) error {
	var err error
	for range 5 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = f(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if sleepCtx(ctx, 500*time.Millisecond) != nil {
			return err
		}
	}
	return err
}
