package admin

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/migrations"
)

// Databases are the databases a process serves (a relay may serve many),
// each with its Service, as they are now: the set may change while the
// process runs.
type Databases struct {
	// Names lists the databases served, in order; the first is the one a
	// request naming none gets.
	Names func() []string
	// Service returns the named database's Service; false when it is not
	// served.
	Service func(name string) (*Service, bool)
}

// One is the Databases of a process serving s alone, under name (may be
// ""): a request naming no database gets it too.
func One(name string, s *Service) Databases {
	return Databases{
		Names:   func() []string { return []string{name} },
		Service: func(n string) (*Service, bool) { return s, n == name },
	}
}

// Pick returns the Service of the database named; "" picks the first. A
// name not served is ErrNotFound, naming the databases served.
func (d Databases) Pick(name string) (*Service, error) {
	names := d.Names()
	if name == "" && len(names) > 0 {
		name = names[0]
	}
	if s, ok := d.Service(name); ok {
		return s, nil
	}
	if len(names) == 1 && names[0] == "" {
		return nil, fmt.Errorf("%w: database %q: this process serves one database; name none", ErrNotFound, name)
	}
	return nil, fmt.Errorf("%w: database %q is not served (databases: %s)", ErrNotFound, name, strings.Join(names, ", "))
}

// DatabaseStatus is one served database as GET /v1/databases lists it.
type DatabaseStatus struct {
	Name string `json:"name"`
	// Default is set on the database a request naming none gets.
	Default bool `json:"default"`
	// Error is why the database did not answer a ping, or its schema
	// version could not be read; empty when it did.
	Error string `json:"error,omitempty"`
	// Schema is the database's schema version against this build's
	// migrations: behind while Pending lists some (a relay serves a database
	// behind, down to its minimum version; docs/relay.md).
	Schema *migrations.Status `json:"schema,omitempty"`
}

// Status pings every database served and reads its schema version (each
// within its QueryTimeout), and lists them in order.
func (d Databases) Status(ctx context.Context) []DatabaseStatus {
	names := d.Names()
	out := make([]DatabaseStatus, 0, len(names))
	for i, n := range names {
		st := DatabaseStatus{Name: n, Default: i == 0}
		if s, ok := d.Service(n); !ok {
			st.Error = "removed"
		} else if err := s.Ping(ctx); err != nil {
			st.Error = err.Error()
		} else if schema, err := s.Schema(ctx); err != nil {
			st.Error = err.Error()
		} else {
			st.Schema = &schema
		}
		out = append(out, st)
	}
	return out
}

// Database is the name the Service was given (Config.Database).
func (s *Service) Database() string { return s.cfg.Database }

// Ping checks that the database answers, within QueryTimeout.
func (s *Service) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return s.cfg.Pool.Ping(ctx)
}

// Schema reads the database's schema version, within QueryTimeout.
func (s *Service) Schema(ctx context.Context) (migrations.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return pooler.SchemaStatus(ctx, s.cfg.Pool)
}
