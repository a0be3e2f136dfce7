package pgrelay

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type nopObserver struct{}

func (nopObserver) Received(int, int)                    {}
func (nopObserver) Claimed(int, int)                     {}
func (nopObserver) Processed(*InboxEvent, time.Duration) {}
func (nopObserver) Retried(*InboxEvent, string)          {}
func (nopObserver) Deferred(*InboxEvent)                 {}
func (nopObserver) Dead(*InboxEvent, string)             {}
func (nopObserver) Fenced(*InboxEvent)                   {}
func (nopObserver) Deleted(int64)                        {}
func (nopObserver) Failed(error)                         {}
func (nopObserver) Sequence(SeqOutcome, int)             {}

// fillInboxConfig returns an InboxConfig with every field set.
func fillInboxConfig(t *testing.T) InboxConfig {
	t.Helper()
	var c InboxConfig
	fill(t, reflect.ValueOf(&c).Elem())
	return c
}

func fill(t *testing.T, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Type() {
		case reflect.TypeFor[*pgxpool.Pool]():
			f.Set(reflect.ValueOf(&pgxpool.Pool{}))
		case reflect.TypeFor[*pgx.ConnConfig]():
			f.Set(reflect.ValueOf(&pgx.ConnConfig{}))
		case reflect.TypeFor[InboxHandler]():
			f.Set(reflect.ValueOf(HandlerFunc(func(context.Context, pgx.Tx, *InboxEvent) error { return nil })))
		case reflect.TypeFor[*slog.Logger]():
			f.Set(reflect.ValueOf(slog.Default()))
		case reflect.TypeFor[time.Duration]():
			f.SetInt(int64(time.Hour))
		default:
			switch f.Kind() {
			case reflect.Interface:
				f.Set(reflect.ValueOf(nopObserver{}))
			case reflect.String:
				f.SetString("x")
			case reflect.Int:
				f.SetInt(7)
			case reflect.Bool:
				f.SetBool(true)
			case reflect.Struct:
				fill(t, f)
			default:
				t.Fatalf("field %s of kind %s: teach fill to set it", v.Type().Field(i).Name, f.Kind())
			}
		}
	}
}

// unset lists the fields of the engine's configuration v, among those the
// public configuration pub also has, that the conversion left zero.
func unset(v, pub reflect.Value, prefix string) []string {
	var out []string
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		p := pub.FieldByName(name)
		if !p.IsValid() || !v.Type().Field(i).IsExported() {
			continue
		}
		if v.Field(i).Kind() == reflect.Struct && v.Field(i).Type() != reflect.TypeFor[time.Time]() {
			out = append(out, unset(v.Field(i), p, prefix+name+".")...)
			continue
		}
		if v.Field(i).IsZero() {
			out = append(out, prefix+name)
		}
	}
	return out
}

// TestInboxConfigConvertsEveryField: every InboxConfig field reaches the
// engine's configuration, so that none is silently ignored.
func TestInboxConfigConvertsEveryField(t *testing.T) {
	c := fillInboxConfig(t)
	e := c.engine()
	if missing := unset(reflect.ValueOf(e), reflect.ValueOf(c), ""); len(missing) > 0 {
		t.Fatalf("InboxConfig fields not passed to the engine: %v", missing)
	}
}
