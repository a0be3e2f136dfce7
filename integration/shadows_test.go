package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// shadowMark starts the warning each shadow raises when it is called; the
// test reads the server's log for it (a warning is logged even when the
// calling transaction is read-only or rolls back).
const shadowMark = "SHADOW CALLED"

// polymorphic maps a pseudo-type to how a concrete type T replaces it.
var polymorphic = map[string]string{
	"anyelement": "%s", "anynonarray": "%s", "anycompatible": "%s", "anycompatiblenonarray": "%s",
	"anyarray": "%s[]", "anycompatiblearray": "%s[]", `"any"`: "text",
}

// pseudo lists the pseudo-types no shadow stands for.
var pseudo = []string{"internal", "cstring", "record", "trigger", "event_trigger", "void", "language_handler", "fdw_handler",
	"index_am_handler", "tsm_handler", "table_am_handler", "unknown"}

// shadowTypes returns the concrete types pgrelay's data has: its tables'
// column types and those of the literals and parameters its SQL passes.
func shadowTypes(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []string {
	t.Helper()
	var types []string
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT array_agg(DISTINCT ty ORDER BY ty) FROM (
			SELECT format_type(CASE WHEN ty.typcategory = 'A' THEN ty.typelem ELSE ty.oid END, NULL) AS ty
			FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_type ty ON ty.oid = a.atttypid
			WHERE c.relnamespace = 'pgrelay'::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
			UNION SELECT unnest(ARRAY['integer', 'bigint', 'smallint', 'numeric', 'double precision', 'text', 'boolean',
				'bytea', 'jsonb', 'uuid', 'interval', 'timestamp with time zone', 'oid', 'name', 'regclass', 'pg_lsn'])) s`).Scan(&types))
	return types
}

// signature is one overload to plant: argument types and result.
type signature struct {
	args   []string
	result string
	retset bool
	// builtin holds the built-in's argument types, to cast to when
	// calling it.
	builtin []string
}

func (s signature) key(name string) string { return name + "(" + strings.Join(s.args, ",") + ")" }

// planter builds the shadow schema's DDL.
type planter struct {
	types []string
	// implicit maps a type to the types that cast to it implicitly.
	implicit map[string][]string
	// builtin holds the signatures pg_catalog has, as name(args).
	builtin map[string]bool
	planted map[string]bool
	ddl     []string
	n       int
}

func newPlanter(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *planter {
	t.Helper()
	p := &planter{types: shadowTypes(t, ctx, pool), implicit: map[string][]string{}, builtin: map[string]bool{}, planted: map[string]bool{}}
	rows, err := pool.Query(ctx, `SELECT format_type(castsource, NULL), format_type(casttarget, NULL) FROM pg_cast WHERE castcontext = 'i'`)
	require.NoError(t, err)
	known := map[string]bool{}
	for _, ty := range p.types {
		known[ty], known[ty+"[]"] = true, true
	}
	for rows.Next() {
		var src, dst string
		require.NoError(t, rows.Scan(&src, &dst))
		if known[src] {
			p.implicit[dst] = append(p.implicit[dst], src)
		}
	}
	require.NoError(t, rows.Err())
	rows, err = pool.Query(ctx, `SELECT proname || '(' || coalesce((SELECT string_agg(format_type(a, NULL), ',' ORDER BY i)
		FROM unnest(proargtypes::oid[]) WITH ORDINALITY AS x(a, i)), '') || ')' FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace
		UNION ALL SELECT oprname || '(' || coalesce(format_type(oprleft, NULL), '-') || ',' || format_type(oprright, NULL) || ')'
		FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		p.builtin[s] = true
	}
	require.NoError(t, rows.Err())
	return p
}

// concrete returns the signatures an overload's argument and result types
// (as format_type prints them) give: each polymorphic type replaced by each
// concrete type, and each concrete argument also by text (what an unknown
// literal prefers) and the types that cast to it implicitly. nil: an
// overload no concrete function can stand for.
func (p *planter) concrete(args []string, result string, retset bool) []signature {
	var out []signature
	for _, ty := range p.types {
		subst := func(a string) (string, bool) {
			if f, ok := polymorphic[a]; ok {
				if strings.Contains(f, "%s") {
					return fmt.Sprintf(f, ty), true
				}
				return f, true
			}
			if strings.HasPrefix(a, "any") || slices.Contains(pseudo, a) {
				return "", false
			}
			return a, true
		}
		res, ok := subst(result)
		if result == "void" {
			res, ok = result, true
		}
		if !ok {
			return nil
		}
		base := make([]string, len(args))
		cands := make([][]string, len(args))
		for i, a := range args {
			c, ok := subst(a)
			if !ok {
				return nil
			}
			base[i] = c
			cands[i] = []string{c}
			if _, poly := polymorphic[a]; !poly {
				for _, alt := range append([]string{"text"}, p.implicit[c]...) {
					if !slices.Contains(cands[i], alt) {
						cands[i] = append(cands[i], alt)
					}
				}
			}
		}
		combos := [][]string{{}}
		for _, cs := range cands {
			var next [][]string
			for _, prefix := range combos {
				for _, c := range cs {
					next = append(next, append(slices.Clone(prefix), c))
				}
			}
			combos = next
			if len(combos) > 256 {
				combos = combos[:256]
			}
		}
		for _, c := range combos {
			out = append(out, signature{args: c, result: res, retset: retset, builtin: base})
		}
	}
	return out
}

// record is the statement a shadow runs first.
func record(what string) string {
	return fmt.Sprintf("RAISE WARNING '%s %%', %s;", shadowMark, quote(what))
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func castArgs(sig signature) string {
	var b strings.Builder
	for i := range sig.args {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "$%d::%s", i+1, sig.builtin[i])
	}
	return b.String()
}

// function plants shadow.name for each concrete signature of a pg_catalog
// function called with one of the argument counts used.
func (p *planter) function(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, arities map[int]bool) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT p.prokind, p.proretset, p.pronargs, p.pronargdefaults, p.provariadic <> 0,
			coalesce((SELECT array_agg(format_type(a, NULL) ORDER BY i) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS x(a, i)), '{}'),
			format_type(p.prorettype, NULL), format_type(p.provariadic, NULL), p.proallargtypes IS NOT NULL
		FROM pg_proc p WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = $1`, name)
	require.NoError(t, err)
	type overload struct {
		kind             string
		retset, variadic bool
		nargs, ndefaults int
		args             []string
		result, varElem  string
		outArgs          bool
	}
	var ovs []overload
	for rows.Next() {
		var o overload
		require.NoError(t, rows.Scan(&o.kind, &o.retset, &o.nargs, &o.ndefaults, &o.variadic, &o.args, &o.result, &o.varElem, &o.outArgs))
		ovs = append(ovs, o)
	}
	require.NoError(t, rows.Err())
	for _, o := range ovs {
		if o.outArgs || o.kind == "w" {
			continue // a window function or OUT arguments: no plain function can stand for it
		}
		for n := range arities {
			var args []string
			switch {
			case n >= o.nargs-o.ndefaults && n <= o.nargs:
				args = o.args[:n]
			case o.variadic && n >= o.nargs-1:
				args = slices.Clone(o.args[:o.nargs-1])
				for len(args) < n {
					args = append(args, o.varElem)
				}
			default:
				continue
			}
			if o.variadic && n == o.nargs && len(args) > 0 && args[len(args)-1] != o.varElem {
				// Called with n arguments, the last is an element, not the array.
				args = append(slices.Clone(args[:n-1]), o.varElem)
			}
			for _, sig := range p.concrete(args, o.result, o.retset) {
				key := sig.key(name)
				if p.builtin[key] || p.planted[key] {
					continue
				}
				p.planted[key] = true
				p.n++
				p.ddl = append(p.ddl, p.functionDDL(name, o.kind == "a", sig))
			}
		}
	}
}

func (p *planter) functionDDL(name string, aggregate bool, sig signature) string {
	id := fmt.Sprintf("shadow.%s", quoteIdent(name))
	params := strings.Join(sig.args, ", ")
	if aggregate {
		fn := fmt.Sprintf("shadow.agg_%d", p.n)
		return fmt.Sprintf(`CREATE FUNCTION %[1]s_step(boolean, %[2]s) RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN %[3]s RETURN true; END $f$;
CREATE FUNCTION %[1]s_final(boolean) RETURNS %[4]s LANGUAGE sql AS $f$ SELECT NULL::%[4]s $f$;
CREATE AGGREGATE %[5]s(%[2]s) (SFUNC = %[1]s_step, STYPE = boolean, FINALFUNC = %[1]s_final);`,
			fn, params, record(sig.key(name)), sig.result, id)
	}
	call := fmt.Sprintf("pg_catalog.%s(%s)", quoteIdent(name), castArgs(sig))
	if sig.result == "void" {
		return fmt.Sprintf(`CREATE FUNCTION %s(%s) RETURNS void LANGUAGE plpgsql AS $f$ BEGIN %s PERFORM %s; END $f$;`,
			id, params, record(sig.key(name)), call)
	}
	if sig.retset {
		return fmt.Sprintf(`CREATE FUNCTION %s(%s) RETURNS SETOF %s LANGUAGE plpgsql AS $f$ BEGIN %s RETURN QUERY SELECT * FROM %s; END $f$;`,
			id, params, sig.result, record(sig.key(name)), call)
	}
	return fmt.Sprintf(`CREATE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql AS $f$ BEGIN %s RETURN %s; END $f$;`,
		id, params, sig.result, record(sig.key(name)), call)
}

// operator plants shadow.op for each concrete signature of a pg_catalog
// operator of that name.
func (p *planter) operator(t *testing.T, ctx context.Context, pool *pgxpool.Pool, op string) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT coalesce(format_type(oprleft, NULL), '-'), format_type(oprright, NULL), format_type(oprresult, NULL), oprleft = 0
		FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace AND oprname = $1 AND oprkind IN ('b', 'l')`, op)
	require.NoError(t, err)
	type overload struct {
		left, right, result string
		prefix              bool
	}
	var ovs []overload
	for rows.Next() {
		var o overload
		require.NoError(t, rows.Scan(&o.left, &o.right, &o.result, &o.prefix))
		ovs = append(ovs, o)
	}
	require.NoError(t, rows.Err())
	for _, o := range ovs {
		args := []string{o.left, o.right}
		if o.prefix {
			args = []string{o.right}
		}
		for _, sig := range p.concrete(args, o.result, false) {
			left := "-"
			if !o.prefix {
				left = sig.args[0]
			}
			key := op + "(" + left + "," + sig.args[len(sig.args)-1] + ")"
			if p.builtin[key] || p.planted[key] {
				continue
			}
			p.planted[key] = true
			p.n++
			fn := fmt.Sprintf("shadow.op_%d", p.n)
			if o.prefix {
				p.ddl = append(p.ddl, fmt.Sprintf(`CREATE FUNCTION %[1]s(%[2]s) RETURNS %[3]s LANGUAGE plpgsql AS $f$ BEGIN %[4]s RETURN OPERATOR(pg_catalog.%[5]s) $1::%[6]s; END $f$;
CREATE OPERATOR shadow.%[5]s (RIGHTARG = %[2]s, FUNCTION = %[1]s);`, fn, sig.args[0], sig.result, record("operator "+key), op, sig.builtin[0]))
				continue
			}
			p.ddl = append(p.ddl, fmt.Sprintf(`CREATE FUNCTION %[1]s(%[2]s, %[3]s) RETURNS %[4]s LANGUAGE plpgsql AS $f$ BEGIN %[5]s RETURN $1::%[7]s OPERATOR(pg_catalog.%[6]s) $2::%[8]s; END $f$;
CREATE OPERATOR shadow.%[6]s (LEFTARG = %[2]s, RIGHTARG = %[3]s, FUNCTION = %[1]s);`, fn, sig.args[0], sig.args[1], sig.result, record("operator "+key), op, sig.builtin[0], sig.builtin[1]))
		}
	}
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// plantShadows creates schema shadow with a shadow of every function and
// operator use names, and puts it on the database's search_path (after
// pg_catalog, which PostgreSQL searches first when the path does not name
// it). It returns how many shadows it planted.
func plantShadows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, database string, use *sqlUse) int {
	t.Helper()
	p := newPlanter(t, ctx, pool)
	fnames := make([]string, 0, len(use.funcs))
	for n := range use.funcs {
		fnames = append(fnames, n)
	}
	slices.Sort(fnames)
	for _, n := range fnames {
		p.function(t, ctx, pool, n, use.funcs[n])
	}
	ops := make([]string, 0, len(use.ops))
	for o := range use.ops {
		ops = append(ops, o)
	}
	slices.Sort(ops)
	for _, o := range ops {
		p.operator(t, ctx, pool, o)
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `CREATE SCHEMA shadow; GRANT USAGE ON SCHEMA shadow TO PUBLIC`)
	require.NoError(t, err)
	for _, ddl := range p.ddl {
		_, err := tx.Exec(ctx, ddl)
		require.NoError(t, err, ddl)
	}
	_, err = tx.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET search_path = shadow, "$user", public`, quoteIdent(database)))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return p.n
}
