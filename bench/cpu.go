package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// CPU accounting of a run: every component's CPU time (utime + stime) read
// from /proc at the run's start and end only, so that the accounting itself
// costs nothing measurable while the run goes on, and the machine's busy and
// idle time from /proc/stat over the same window.
//
// PostgreSQL is all the processes of the server: the postmaster and its
// children (backends, walwriter, checkpointer, autovacuum, ...). The
// postmaster is the parent of the backend serving a connection of ours
// (pg_backend_pid()), checked against pg_postmaster_start_time(): a backend
// pid alone could name an unrelated local process when the server is remote.
// Its CPU is the children's utime + stime plus the postmaster's own and its
// cutime + cstime, the time of children it has reaped: a backend that exits
// during the run (a pool closing a connection) moves its time from the one
// term to the other and is still counted. This needs the server on this
// machine, in the same PID namespace; otherwise PostgreSQL is reported n/a.

// cpuComponent names, in the order they are reported.
const (
	cpuRelay    = "relay"
	cpuConsumer = "consumer"
	cpuNATS     = "nats"
	cpuPostgres = "postgres"
	cpuBench    = "bench"
	cpuOther    = "other"
	cpuBusy     = "busy"
)

// procStat is the part of /proc/<pid>/stat the accounting reads.
type procStat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime float64 // seconds
	start                        float64 // seconds after boot
}

// readProcStat parses /proc/<pid>/stat (pid 0: this process).
func readProcStat(pid int) (procStat, error) {
	path := "/proc/self/stat"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (procStat, error) {
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after it start behind the last ')'.
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return procStat{}, errors.New("malformed /proc stat line")
	}
	fields := strings.Fields(s[closing+1:])
	// fields[0] is field 3 (state): field k is fields[k-3].
	if len(fields) < 20 {
		return procStat{}, errors.New("short /proc stat line")
	}
	var v [5]float64
	for i, k := range []int{14, 15, 16, 17, 22} {
		n, err := strconv.ParseFloat(fields[k-3], 64)
		if err != nil {
			return procStat{}, fmt.Errorf("/proc stat field %d: %w", k, err)
		}
		v[i] = n / clockTicks
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return procStat{}, fmt.Errorf("/proc stat ppid: %w", err)
	}
	return procStat{comm: s[open+1 : closing], ppid: ppid, utime: v[0], stime: v[1], cutime: v[2], cstime: v[3], start: v[4]}, nil
}

// machineCPU is the machine's CPU time so far, all CPUs, from /proc/stat.
type machineCPU struct{ busy, idle float64 } // seconds

func readMachineCPU() (machineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	return parseMachineCPU(string(b))
}

// parseMachineCPU reads the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already in user). Idle is idle +
// iowait: a CPU waiting for a disk runs nothing else.
func parseMachineCPU(s string) (machineCPU, error) {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var m machineCPU
		for i, x := range f[1:min(len(f), 9)] {
			n, err := strconv.ParseFloat(x, 64)
			if err != nil {
				return machineCPU{}, fmt.Errorf("/proc/stat: %w", err)
			}
			if i == 3 || i == 4 {
				m.idle += n / clockTicks
			} else {
				m.busy += n / clockTicks
			}
		}
		return m, nil
	}
	return machineCPU{}, errors.New("/proc/stat: no cpu line")
}

// postgresCPU returns the CPU seconds of the server whose postmaster is pid:
// see the comment at the top of this file.
func postgresCPU(postmaster int) (float64, error) {
	pm, err := readProcStat(postmaster)
	if err != nil {
		return 0, fmt.Errorf("postmaster: %w", err)
	}
	total := pm.utime + pm.stime + pm.cutime + pm.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.ppid != postmaster {
			continue // gone meanwhile, or not the server's
		}
		total += st.utime + st.stime
	}
	return total, nil
}

// findPostmaster locates the postmaster of the server conn is connected to in
// /proc, or says why it cannot.
func findPostmaster(ctx context.Context, conn *pgx.Conn) (int, error) {
	var backend int
	var started time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), pg_postmaster_start_time()").Scan(&backend, &started); err != nil {
		return 0, err
	}
	be, err := readProcStat(backend)
	if err != nil {
		return 0, fmt.Errorf("server not on this machine (no process %d, its backend): %w", backend, err)
	}
	pm, err := readProcStat(be.ppid)
	if err != nil || !isPostgresComm(be.comm) || !isPostgresComm(pm.comm) {
		return 0, fmt.Errorf("server not on this machine (process %d is %q, not its backend)", backend, be.comm)
	}
	boot, err := bootTime()
	if err != nil {
		return 0, err
	}
	at := boot.Add(time.Duration(pm.start * float64(time.Second)))
	if d := at.Sub(started); d > 2*time.Second || d < -2*time.Second {
		return 0, fmt.Errorf("server not on this machine (process %d started at %s, the server at %s)", be.ppid, at.Format(time.RFC3339), started.Format(time.RFC3339))
	}
	return be.ppid, nil
}

func isPostgresComm(c string) bool { return c == "postgres" || c == "postmaster" }

// bootTime is /proc/stat's btime.
func bootTime() (time.Time, error) {
	for _, line := range strings.Split(readFile("/proc/stat"), "\n") {
		if rest, ok := strings.CutPrefix(line, "btime "); ok {
			s, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			return time.Unix(s, 0), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat: no btime")
}

// findNATSServer locates the nats-server process serving natsURL: the process
// holding the socket that listens on its port (through /proc/net/tcp and
// /proc/<pid>/fd, readable as root or as the server's owner), else the only
// process named nats-server. A server on another host is not found.
func findNATSServer(natsURL string) (int, error) {
	u, err := url.Parse(natsURL)
	if err != nil {
		return 0, err
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "4222"
	}
	if !isLocalHost(host) {
		return 0, fmt.Errorf("nats-server at %s is not on this machine", host)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0, err
	}
	inodes := listeningInodes(int(p))
	var named []int
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if len(inodes) > 0 {
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			for _, fd := range fds {
				link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
				if err == nil && inodes[link] {
					return pid, nil
				}
			}
		}
		if strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pid))) == "nats-server" {
			named = append(named, pid)
		}
	}
	if len(named) == 1 {
		return named[0], nil
	}
	return 0, fmt.Errorf("no process found listening on port %d (%d named nats-server)", p, len(named))
}

// listeningInodes returns the socket inodes listening on a TCP port, as the
// fd link text "socket:[inode]".
func listeningInodes(port int) map[string]bool {
	out := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, line := range strings.Split(readFile(f), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if n, err := strconv.ParseUint(hexPort, 16, 32); ok && err == nil && int(n) == port {
				out["socket:["+fields[9]+"]"] = true
			}
		}
	}
	return out
}

func isLocalHost(host string) bool {
	if host == "" || host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return true
		}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}

// cpuSources are the processes whose CPU a run accounts for. A pid of 0 is a
// component not measured, for the reason in missing (or folded into the
// benchmark's own process, for in-process services).
type cpuSources struct {
	pids       map[string]int    // relay, consumer, nats: processes
	postmaster int               // 0: PostgreSQL not measured
	missing    map[string]string // component → why it is not measured
}

// cpuSnapshot is the CPU time of every source at one moment.
type cpuSnapshot struct {
	at      time.Time
	secs    map[string]float64
	errs    map[string]string
	machine machineCPU
	mErr    error
}

func (s cpuSources) snapshot() cpuSnapshot {
	snap := cpuSnapshot{at: time.Now(), secs: map[string]float64{}, errs: map[string]string{}}
	for name, why := range s.missing {
		snap.errs[name] = why
	}
	if st, err := readProcStat(0); err != nil {
		snap.errs[cpuBench] = err.Error()
	} else {
		snap.secs[cpuBench] = st.utime + st.stime
	}
	for name, pid := range s.pids {
		if st, err := readProcStat(pid); err != nil {
			snap.errs[name] = err.Error()
		} else {
			snap.secs[name] = st.utime + st.stime
		}
	}
	if s.postmaster != 0 {
		if v, err := postgresCPU(s.postmaster); err != nil {
			snap.errs[cpuPostgres] = err.Error()
		} else {
			snap.secs[cpuPostgres] = v
		}
	}
	snap.machine, snap.mErr = readMachineCPU()
	return snap
}

// cpuUse is the CPU a window (or a sum of windows) used: seconds per
// component, and the machine's busy and idle seconds.
type cpuUse struct {
	secs    map[string]float64
	errs    map[string]string
	machine machineCPU
	mErr    error
}

// since is the CPU used from an earlier snapshot to this one.
func (s cpuSnapshot) since(from cpuSnapshot) cpuUse {
	u := cpuUse{secs: map[string]float64{}, errs: map[string]string{}, mErr: errors.Join(from.mErr, s.mErr)}
	for name, why := range from.errs {
		u.errs[name] = why
	}
	for name, why := range s.errs {
		u.errs[name] = why
	}
	for name, v := range s.secs {
		if v0, ok := from.secs[name]; ok {
			if _, bad := u.errs[name]; !bad {
				u.secs[name] = v - v0
			}
		}
	}
	u.machine = machineCPU{busy: s.machine.busy - from.machine.busy, idle: s.machine.idle - from.machine.idle}
	return u
}

// plus adds two windows' use (a measurement made of separate phases).
func (u cpuUse) plus(v cpuUse) cpuUse {
	w := cpuUse{secs: map[string]float64{}, errs: map[string]string{}, mErr: errors.Join(u.mErr, v.mErr)}
	for _, x := range []cpuUse{u, v} {
		for name, why := range x.errs {
			w.errs[name] = why
		}
	}
	for name, a := range u.secs {
		if b, ok := v.secs[name]; ok {
			if _, bad := w.errs[name]; !bad {
				w.secs[name] = a + b
			}
		}
	}
	w.machine = machineCPU{busy: u.machine.busy + v.machine.busy, idle: u.machine.idle + v.machine.idle}
	return w
}

// cpuFigureID is the id of a run's CPU figure for a component.
func cpuFigureID(run, component string) string { return "cpu_" + run + "_" + component }

// record samples a run's CPU figures: each measured component's CPU ms per
// event, the rest of the machine's busy time per event when every component
// is measured, and the machine's busy share. The components a run has are
// those declared for it; the others are left alone.
func (b *bench) recordCPU(run string, u cpuUse, events int) {
	if events <= 0 {
		return
	}
	perEvent := func(secs float64) float64 { return secs * 1000 / float64(events) }
	accounted, complete := 0.0, true
	for _, c := range []string{cpuRelay, cpuConsumer, cpuNATS, cpuPostgres, cpuBench} {
		id := cpuFigureID(run, c)
		if b.res.lookup(id) == nil {
			continue // not a process of its own in this run
		}
		if v, ok := u.secs[c]; ok {
			b.sample(id, perEvent(v))
			accounted += v
			continue
		}
		complete = false
		why := u.errs[c]
		if why == "" {
			why = "not measured"
		}
		b.fail([]string{id}, errors.New(why))
	}
	if u.mErr != nil {
		b.fail([]string{cpuFigureID(run, cpuOther), cpuFigureID(run, cpuBusy)}, u.mErr)
		return
	}
	if complete {
		b.sample(cpuFigureID(run, cpuOther), perEvent(u.machine.busy-accounted))
	} else {
		b.fail([]string{cpuFigureID(run, cpuOther)}, errors.New("a component is not measured"))
	}
	if total := u.machine.busy + u.machine.idle; total > 0 {
		b.sample(cpuFigureID(run, cpuBusy), 100*u.machine.busy/total)
	}
}

// cpuSources returns the processes of a pipeline's run: its services when
// they are processes, nats-server, and the PostgreSQL server of dbs.
func (b *bench) cpuSources(dbs *databases, procs map[string]*process) cpuSources {
	s := cpuSources{pids: map[string]int{}, missing: map[string]string{}}
	for name, p := range procs {
		s.pids[name] = p.Pid()
	}
	if b.nats != nil && b.nats.srv == nil {
		if b.nats.pid != 0 {
			s.pids[cpuNATS] = b.nats.pid
		} else {
			s.missing[cpuNATS] = b.nats.pidErr
		}
	}
	if dbs != nil && dbs.postmaster != 0 {
		s.postmaster = dbs.postmaster
	} else if dbs != nil {
		s.missing[cpuPostgres] = dbs.postmasterErr
	}
	return s
}
