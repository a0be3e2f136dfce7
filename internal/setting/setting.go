// Package setting holds FieldError, the configuration error that names the
// field it is about. Validation returns it instead of a sentence with the
// field's name spelled inside, so that a caller exposing the field under
// another name (the public ConsumerConfig over the internal configs, a
// command's flag and environment variable) renames the field, not text.
package setting

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// FieldError is an invalid setting: the field of a configuration struct it is
// about, and what is wrong with it.
type FieldError struct {
	// Pkg is the reporting package ("relay", "inbox"), printed before the
	// message; empty prints none.
	Pkg string
	// Struct is the configuration struct's name: "Config", "ConsumerConfig".
	Struct string
	// Field is the field at fault, its path in Struct: "BatchSize",
	// "Inbox.Lease".
	Field string
	// Format and Args are the message, as for fmt.Errorf: "{}" in Format
	// stands for Field and "{Name}" for the field Name of Struct.
	Format string
	Args   []any
	// Cause, when set, is an error e stands for (Unwrap returns it); its
	// text is not printed.
	Cause error
	// Name, when set, spells the fields in the message (a command names its
	// flags); by default a field F is spelled Struct.F.
	Name func(field string) string
}

// Errorf returns a FieldError of the field of structName in package pkg.
func Errorf(pkg, structName, field, format string, args ...any) *FieldError {
	return &FieldError{Pkg: pkg, Struct: structName, Field: field, Format: format, Args: args}
}

var fieldRef = regexp.MustCompile(`\{[A-Za-z0-9_.\[\]]*\}`)

// Error spells the message with its fields' names.
func (e *FieldError) Error() string {
	name := e.Name
	if name == nil {
		name = func(f string) string { return e.Struct + "." + f }
	}
	format := fieldRef.ReplaceAllStringFunc(e.Format, func(ref string) string {
		f := ref[1 : len(ref)-1]
		if f == "" {
			f = e.Field
		}
		return strings.ReplaceAll(name(f), "%", "%%")
	})
	msg := fmt.Errorf(format, e.Args...).Error()
	if e.Pkg != "" {
		msg = e.Pkg + ": " + msg
	}
	return msg
}

// Unwrap returns Cause and the errors among Args.
func (e *FieldError) Unwrap() []error {
	var errs []error
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	for _, a := range e.Args {
		if err, ok := a.(error); ok {
			errs = append(errs, err)
		}
	}
	return errs
}

// Renamed returns a copy of e in structName whose fields are renamed by
// rename (a field it returns unchanged keeps its name). A new name may be an
// expression of fields in braces, as "10 × {FetchBatchSize}".
func (e *FieldError) Renamed(structName string, rename func(field string) string) *FieldError {
	c := *e
	c.Struct = structName
	spell := func(f string) string {
		n := rename(f)
		if strings.Contains(n, "{") {
			return n
		}
		return "{" + n + "}"
	}
	c.Format = fieldRef.ReplaceAllStringFunc(e.Format, func(ref string) string {
		f := ref[1 : len(ref)-1]
		if f == "" {
			f = e.Field
		}
		return spell(f)
	})
	c.Field = rename(e.Field)
	if refs := fieldRef.FindAllString(c.Field, 1); len(refs) == 1 {
		c.Field = refs[0][1 : len(refs[0])-1]
	}
	return &c
}

// Map returns err with every FieldError in it replaced by f's result, keeping
// the rest: errors joined with errors.Join are mapped one by one, and a
// wrapping error that prints a prefix before the error it wraps keeps its
// prefix. An error without a FieldError is returned as it is.
func Map(err error, f func(*FieldError) error) error {
	if err == nil {
		return nil
	}
	if fe, ok := err.(*FieldError); ok {
		return f(fe)
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs := j.Unwrap()
		out := make([]error, len(errs))
		changed := false
		for i, e := range errs {
			out[i] = Map(e, f)
			changed = changed || out[i] != e
		}
		if !changed {
			return err
		}
		return errors.Join(out...)
	}
	inner := errors.Unwrap(err)
	if inner == nil {
		return err
	}
	msg, tail := err.Error(), inner.Error()
	mapped := Map(inner, f)
	if mapped == inner || !strings.HasSuffix(msg, tail) {
		return err
	}
	return &prefixed{prefix: msg[:len(msg)-len(tail)], err: mapped}
}

// prefixed is a wrapping error rebuilt around its mapped inner error.
type prefixed struct {
	prefix string
	err    error
}

func (p *prefixed) Error() string { return p.prefix + p.err.Error() }
func (p *prefixed) Unwrap() error { return p.err }

// Name returns err with the fields of its FieldErrors spelled by name, and
// without their package prefix: what a command prints, naming its flags.
// A field name returns "" for is spelled Struct.Field as before.
func Name(err error, name func(field string) string) error {
	return Map(err, func(fe *FieldError) error {
		c := *fe
		c.Pkg = ""
		c.Name = func(f string) string {
			if n := name(f); n != "" {
				return n
			}
			return fe.Struct + "." + f
		}
		return &c
	})
}
