package main

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Machine describes where the figures were measured.
type Machine struct {
	Hostname   string `json:"hostname"`
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model"`
	MemoryMiB  int64  `json:"memory_mib"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	Postgres   string `json:"postgres_version"`
	NATS       string `json:"nats_version"`
	NATSServer string `json:"nats_server"`
	LoadAvg    string `json:"load_average_at_start"`
}

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	m.Kernel = strings.TrimSpace(readFile("/proc/sys/kernel/osrelease"))
	if f := strings.Fields(readFile("/proc/loadavg")); len(f) >= 3 {
		m.LoadAvg = strings.Join(f[:3], " ")
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	for _, line := range strings.Split(readFile("/proc/meminfo"), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			for _, r := range strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")) {
				if r >= '0' && r <= '9' {
					kb = kb*10 + int64(r-'0')
				}
			}
			m.MemoryMiB = kb / 1024
		}
	}
	return m
}

// postgresSettings returns the server version and the settings that shape the
// figures.
func postgresSettings(ctx context.Context, url string) (string, map[string]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(context.Background())
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		return "", nil, err
	}
	settings := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT name, setting || coalesce(unit, '') FROM pg_settings
		WHERE name IN ('synchronous_commit', 'fsync', 'wal_level', 'shared_buffers', 'max_connections',
		               'work_mem', 'max_wal_size', 'checkpoint_timeout', 'full_page_writes', 'wal_sync_method',
		               'commit_delay', 'autovacuum')`)
	if err != nil {
		return "", nil, err
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return "", nil, err
		}
		settings[k] = v
	}
	return version, settings, rows.Err()
}

func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}
