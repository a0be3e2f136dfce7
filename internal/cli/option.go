package cli

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay/internal/setting"
)

// Option is one setting of a command: its flag, the environment variable
// that defaults it, the configuration field it fills (errors about the field
// name the option; "" for none), where it is stored and its help text.
type Option struct {
	Flag, Env, Field string
	// Ptr is a *string, *int, *bool, *float64, *time.Duration or
	// *[]string (repeatable; ';'-separated in the environment).
	Ptr   any
	Def   any
	Usage string
}

// Opt is an Option, for a command's table.
func Opt(flag, env, field string, ptr, def any, usage string) Option {
	return Option{flag, env, field, ptr, def, usage}
}

// Options are a command's settings: every flag name and environment
// variable is written once, in its table.
type Options []Option

// Bind registers opts on f, each defaulted from its environment variable,
// its help ending "(env NAME)", and returns the typed variables' kinds for
// ValidateEnv.
func Bind(f *pflag.FlagSet, opts Options) map[string]string {
	kinds := map[string]string{}
	for _, o := range opts {
		usage := o.Usage + " (env " + o.Env + ")"
		switch p := o.Ptr.(type) {
		case pflag.Value: // defaulted by its Default method, when it has one
			if d, ok := p.(interface{ Default(string) }); ok {
				d.Default(os.Getenv(o.Env))
			}
			f.Var(p, o.Flag, usage)
		case *string:
			f.StringVar(p, o.Flag, EnvString(o.Env, o.Def.(string)), usage)
		case *int:
			f.IntVar(p, o.Flag, EnvInt(o.Env, o.Def.(int)), usage)
			kinds[o.Env] = "int"
		case *bool:
			f.BoolVar(p, o.Flag, EnvBool(o.Env, o.Def.(bool)), usage)
			kinds[o.Env] = "bool"
		case *float64:
			f.Float64Var(p, o.Flag, EnvFloat(o.Env, o.Def.(float64)), usage)
			kinds[o.Env] = "number"
		case *time.Duration:
			f.DurationVar(p, o.Flag, EnvDuration(o.Env, o.Def.(time.Duration)), usage)
			kinds[o.Env] = "duration"
		case *[]string:
			f.StringArrayVar(p, o.Flag, envList(o.Env), usage)
		default:
			panic(fmt.Sprintf("cli.Bind: --%s stores into a %T", o.Flag, p))
		}
	}
	return kinds
}

// Name spells the option that fills field, "--flag (ENV)"; "" when none
// does.
func (opts Options) Name(field string) string {
	for _, o := range opts {
		if o.Field == field {
			return o.spell()
		}
	}
	return ""
}

// Of spells the option stored at ptr, "--flag (ENV)", for the errors about
// settings that fill no configuration field.
func (opts Options) Of(ptr any) string {
	for _, o := range opts {
		if o.Ptr == ptr {
			return o.spell()
		}
	}
	panic("cli.Options.Of: no option stores there")
}

func (o Option) spell() string { return "--" + o.Flag + " (" + o.Env + ")" }

// Given reports whether the option that fills field was set, by its flag
// or its environment variable.
func (opts Options) Given(f *pflag.FlagSet, field string) bool {
	for _, o := range opts {
		if o.Field == field {
			_, env := os.LookupEnv(o.Env)
			return env || f.Changed(o.Flag)
		}
	}
	return false
}

// NameErrors spells the fields of structName in err's *setting.FieldErrors
// as the options that set them, without the package prefix (the command
// prints its own name); other FieldErrors (a broker adapter's, named by its
// side already) are kept.
func (opts Options) NameErrors(err error, structName string) error {
	return setting.Name(err, structName, opts.Name)
}

// envList splits the environment variable name on ';' (empty entries
// dropped).
func envList(name string) []string {
	var out []string
	for _, v := range strings.Split(os.Getenv(name), ";") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
