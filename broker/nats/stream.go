package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// Defaults of the stream pgrelay publishes to, consumes and creates: the
// one place the relay, the consumer and the commands take them from.
const (
	// DefaultStream is the JetStream stream's name.
	DefaultStream = "PGRELAY"
	// DefaultSubjectPrefix prefixes every subject: topic "orders" is
	// published to "pgrelay.orders"; the stream stores "pgrelay.>".
	DefaultSubjectPrefix = "pgrelay"
	// DefaultStreamMaxAge is how long a stream pgrelay creates keeps a
	// message: 6 days, a day below the consumer's default dedup window
	// (7 days), so that nothing the stream can replay outlives the inbox rows
	// that recognise it as a duplicate.
	DefaultStreamMaxAge = 6 * 24 * time.Hour
	// DefaultDuplicateWindow is the stream's own dedup window on Nats-Msg-Id
	// (JetStream's default).
	DefaultDuplicateWindow = 2 * time.Minute
)

// StreamSpec is the stream pgrelay creates when asked to (the relay's
// --create-stream, always on with its embedded server; the consumer's
// --create-stream). Both services create it from this one description.
type StreamSpec struct {
	// Name is the stream's name. Required.
	Name string
	// SubjectPrefix gives the stream's subjects, "<SubjectPrefix>.>".
	// Required.
	SubjectPrefix string
	// MaxAge is how long the stream keeps a message. Zero means
	// DefaultStreamMaxAge; negative means no age limit.
	MaxAge time.Duration
	// DuplicateWindow is the stream's dedup window. Zero means
	// DefaultDuplicateWindow. It is capped at MaxAge, as JetStream requires.
	DuplicateWindow time.Duration
	// Replicas is how many servers of a JetStream cluster keep the stream
	// (1, 3 or 5; 3 survives the loss of one node). Zero means 1, which is
	// the only value a single server accepts.
	Replicas int
}

// Config returns the JetStream configuration of a new stream: file storage,
// the subjects "<SubjectPrefix>.>", MaxAge and the duplicate window.
func (s StreamSpec) Config() jetstream.StreamConfig {
	maxAge := s.MaxAge
	switch {
	case maxAge == 0:
		maxAge = DefaultStreamMaxAge
	case maxAge < 0:
		maxAge = 0 // JetStream: no limit
	}
	dup := s.DuplicateWindow
	if dup <= 0 {
		dup = DefaultDuplicateWindow
	}
	if maxAge > 0 && dup > maxAge {
		dup = maxAge
	}
	replicas := s.Replicas
	if replicas <= 0 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Replicas:   replicas,
		Name:       s.Name,
		Subjects:   []string{s.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		MaxAge:     maxAge,
		Duplicates: dup,
	}
}

// EnsureStream creates the stream described by spec when it does not exist,
// and never changes an existing one: its settings belong to whoever created
// it (an operator may well have chosen another MaxAge, duplicate window or
// size limit). When an existing stream differs from spec in a setting pgrelay
// relies on (subjects, storage, MaxAge, duplicate window), a warning naming
// each field with both values goes to log. It returns the stream's current
// information (configuration, creation time).
func EnsureStream(ctx context.Context, js jetstream.JetStream, spec StreamSpec, log *slog.Logger) (*jetstream.StreamInfo, error) {
	return ensureStream(ctx, js, spec, logbridge.Or(log))
}

func ensureStream(ctx context.Context, js jetstream.JetStream, spec StreamSpec, log *slog.Logger) (*jetstream.StreamInfo, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	want := spec.Config()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if err == nil {
			log.Info("stream created", slog.String("stream", want.Name), slog.Any("subjects", want.Subjects),
				slog.Duration("max_age", want.MaxAge), slog.Duration("duplicate_window", want.Duplicates))
			return s.CachedInfo(), nil
		}
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, want.Name) // created meanwhile by another process
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s for %s: %w", want.Name, strings.Join(want.Subjects, ","), err)
	}
	info := s.CachedInfo()
	if diffs := StreamMismatches(want, info.Config); len(diffs) > 0 {
		log.Warn("the existing stream differs from pgrelay's settings; it is left as it is",
			slog.String("stream", want.Name), slog.Any("fields", diffs))
	}
	return info, nil
}

// StreamMismatches lists the settings pgrelay relies on in which got differs
// from want, each as "Field: got X, pgrelay would create Y".
func StreamMismatches(want, got jetstream.StreamConfig) []string {
	var diffs []string
	add := func(field string, g, w any) {
		diffs = append(diffs, fmt.Sprintf("%s: got %v, pgrelay would create %v", field, g, w))
	}
	if !slices.Contains(got.Subjects, want.Subjects[0]) {
		add("Subjects", got.Subjects, want.Subjects)
	}
	if got.Storage != want.Storage {
		add("Storage", got.Storage, want.Storage)
	}
	if got.MaxAge != want.MaxAge {
		add("MaxAge", age(got.MaxAge), age(want.MaxAge))
	}
	if got.Duplicates != want.Duplicates {
		add("Duplicates", got.Duplicates, want.Duplicates)
	}
	return diffs
}

// age prints a MaxAge, where zero means no limit.
func age(d time.Duration) string {
	if d == 0 {
		return "unlimited"
	}
	return d.String()
}
