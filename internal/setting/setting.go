// Package setting holds FieldError, the configuration error that names the
// field it is about. Validation returns it instead of a sentence with the
// field's name spelled inside, so that a caller exposing the field under
// another name (a command's flag and environment variable) names the field,
// not text.
package setting

import (
	"cmp"
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
	// Path, when set, is where in Struct the fields named are: "Inbox." for
	// the fields of consumer.Config.Inbox. A field F is spelled as Path+F.
	Path string
	// Field is the field at fault, its path in Struct (after Path):
	// "BatchSize", "Retention.Window".
	Field string
	// Format and Args are the message, as for fmt.Errorf: "{}" in Format
	// stands for Field and "{Name}" for the field Name of Struct.
	Format string
	Args   []any
	// Cause, when set, is an error e stands for (Unwrap returns it); its
	// text is not printed.
	Cause error
	// Name, when set, spells the fields in the message (a command names its
	// flags); by default a field F is spelled Struct.Path+F.
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
		return strings.ReplaceAll(name(e.Path+f), "%", "%%")
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

// Each calls f with every FieldError of err: err itself, the errors it
// wraps and those joined in it (not the errors a FieldError wraps). A
// change f makes shows in a wrapping error's text only through
// errors.Join, which spells its errors when printed; fmt.Errorf spells
// them at once (Name rebuilds those).
func Each(err error, f func(*FieldError)) {
	switch e := err.(type) {
	case nil:
	case *FieldError:
		f(e)
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			Each(x, f)
		}
	default:
		Each(errors.Unwrap(err), f)
	}
}

// Name returns err with the fields of its FieldErrors of structName (""
// for every one) spelled by name, and without their package prefix: what a
// command prints, naming its flags. A field name returns "" for keeps its
// spelling. Errors joined with errors.Join are named one by one, and a
// wrapping error that prints a prefix before the error it wraps keeps its
// prefix.
func Name(err error, structName string, name func(field string) string) error {
	if err == nil {
		return nil
	}
	if fe, ok := err.(*FieldError); ok {
		if structName != "" && fe.Struct != structName {
			return fe
		}
		c := *fe
		c.Pkg, c.Name = "", func(f string) string { return cmp.Or(name(f), fe.Struct+"."+f) }
		return &c
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs := j.Unwrap()
		out := make([]error, len(errs))
		changed := false
		for i, e := range errs {
			out[i] = Name(e, structName, name)
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
	named := Name(inner, structName, name)
	if named == inner || !strings.HasSuffix(msg, tail) {
		return err
	}
	return &prefixed{prefix: msg[:len(msg)-len(tail)], err: named}
}

// prefixed is a wrapping error rebuilt around its named inner error.
type prefixed struct {
	prefix string
	err    error
}

func (p *prefixed) Error() string { return p.prefix + p.err.Error() }
func (p *prefixed) Unwrap() error { return p.err }
