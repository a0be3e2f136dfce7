package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	pg_query "github.com/pganalyze/pg_query_go/v6"
	"github.com/stretchr/testify/require"
)

// This file finds every function and operator name pgrelay's SQL uses: the
// statements of queries/*.sql, the SQL string literals of the module's
// non-test Go code, and the bodies of the functions in schema pgrelay.

// sqlUse is what the parser found in pgrelay's SQL.
type sqlUse struct {
	// funcs maps a function name to the argument counts it is called with.
	funcs map[string]map[int]bool
	// ops holds the operator names used (those that IN, BETWEEN, LIKE and
	// the like resolve to included).
	ops map[string]bool
	// unqualified lists the statements' calls of a pg_catalog function
	// that name no schema ("file:line name").
	unqualified []string
	// unparsed counts Go string literals that look like SQL but do not parse.
	unparsed []string
	// calls lists every function and operator use seen, in order.
	calls []string
}

func newSQLUse() *sqlUse {
	return &sqlUse{funcs: map[string]map[int]bool{}, ops: map[string]bool{}}
}

// sqlStart matches text that begins like an SQL statement (keywords in
// capitals, as pgrelay writes them).
var sqlStart = regexp.MustCompile(`(?s)^\s*(\(\s*)?(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|TRUNCATE|LOCK|SET|SHOW|DO|COPY|COMMIT|ROLLBACK|END|EXPLAIN|VALUES|GRANT|REVOKE|COMMENT|CALL|LISTEN|NOTIFY|UNLISTEN|BEGIN|START|DECLARE|FETCH|CLOSE|REFRESH|ANALYZE|VACUUM|REINDEX|CLUSTER)\b`)

// fmtVerb matches a fmt verb, replaced by filler of its length before
// parsing so that the parser's offsets stay the literal's.
var fmtVerb = regexp.MustCompile(`%(\[\d+\])?[-+# 0]*\d*(\.\d+)?[sdvqx]`)

// statement parses sql (from where, for messages) and records its calls;
// statements (not function bodies) must qualify their pg_catalog calls.
func (u *sqlUse) statement(t *testing.T, builtins map[string]bool, where string, sql string, checkQualified bool, lineOf func(off int) string) bool {
	t.Helper()
	filled := fmtVerb.ReplaceAllStringFunc(sql, func(v string) string { return strings.Repeat("x", len(v)) })
	tree, err := pg_query.ParseToJSON(filled)
	if err != nil {
		return false
	}
	var root any
	require.NoError(t, json.Unmarshal([]byte(tree), &root))
	u.walk(root, func(name []string, nargs int, loc int) {
		fn := name[len(name)-1]
		u.calls = append(u.calls, fn)
		if len(name) == 1 || name[0] == "pg_catalog" {
			if u.funcs[fn] == nil {
				u.funcs[fn] = map[int]bool{}
			}
			u.funcs[fn][nargs] = true
		}
		if checkQualified && len(name) == 1 && builtins[fn] {
			u.unqualified = append(u.unqualified, fmt.Sprintf("%s %s()", lineOf(loc), fn))
		}
	})
	return true
}

func names(v any) []string {
	var out []string
	for _, n := range asList(v) {
		if s, ok := asMap(n)["String"]; ok {
			out = append(out, asMap(s)["sval"].(string))
		}
	}
	return out
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }

// walk visits the tree's function calls and records its operators.
func (u *sqlUse) walk(v any, call func(name []string, nargs int, loc int)) {
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			u.walk(e, call)
		}
	case map[string]any:
		if fc, ok := v["FuncCall"]; ok {
			m := asMap(fc)
			loc, _ := m["location"].(float64)
			call(names(m["funcname"]), len(asList(m["args"])), int(loc))
		}
		if ae, ok := v["A_Expr"]; ok {
			m := asMap(ae)
			u.calls = append(u.calls, "operator")
			op := names(m["name"])
			switch m["kind"] {
			case "AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN", "AEXPR_BETWEEN_SYM", "AEXPR_NOT_BETWEEN_SYM":
				for _, o := range []string{">=", "<=", ">", "<"} {
					u.ops[o] = true
				}
			case "AEXPR_DISTINCT", "AEXPR_NOT_DISTINCT", "AEXPR_NULLIF":
				u.ops["="] = true
			default:
				if len(op) > 0 {
					u.ops[op[len(op)-1]] = true
				}
			}
		}
		if sl, ok := v["SubLink"]; ok {
			if op := names(asMap(sl)["operName"]); len(op) > 0 {
				u.calls = append(u.calls, "operator")
				u.ops[op[len(op)-1]] = true
			}
		}
		if _, ok := v["CaseExpr"]; ok {
			u.ops["="] = true
		}
		for _, e := range v {
			u.walk(e, call)
		}
	}
}

// repoRoot is the module's root (this package's parent).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	return filepath.Dir(wd)
}

// lineCounter maps a byte offset of text to "file:line".
func lineCounter(file string, text string, firstLine int) func(int) string {
	return func(off int) string {
		off = min(max(off, 0), len(text))
		return fmt.Sprintf("%s:%d", file, firstLine+strings.Count(text[:off], "\n"))
	}
}

// collectQueries parses queries/*.sql.
func (u *sqlUse) collectQueries(t *testing.T, builtins map[string]bool) int {
	t.Helper()
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "queries", "*.sql"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		rel, _ := filepath.Rel(root, f)
		require.True(t, u.statement(t, builtins, rel, string(b), true, lineCounter(rel, string(b), 1)), "%s does not parse", rel)
		n += strings.Count(string(b), "-- name:")
	}
	return n
}

// skipGoDir reports the directories whose Go code pgrelay does not run in
// production: benchmarks, test helpers and the generated queries (parsed
// from queries/*.sql).
func skipGoDir(rel string) bool {
	base := filepath.Base(rel)
	return rel == "bench" || rel == "integration" || rel == filepath.Join("internal", "db") ||
		strings.HasPrefix(base, "test") || strings.HasSuffix(base, "test") || base == "exampleenv" ||
		base == "testdata" || strings.HasPrefix(base, ".")
}

// collectGo parses the SQL string literals (and constant concatenations of
// them) of the module's non-test Go files.
func (u *sqlUse) collectGo(t *testing.T, builtins map[string]bool) int {
	t.Helper()
	root := repoRoot(t)
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && skipGoDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(node ast.Node) bool {
			var e ast.Expr
			switch node := node.(type) {
			case *ast.BasicLit:
				e = node
			case *ast.BinaryExpr:
				e = node
			default:
				return true
			}
			s, pos, ok := constString(e)
			if !ok {
				return true
			}
			if sqlStart.MatchString(s) {
				line := fset.Position(pos).Line
				if u.statement(t, builtins, rel, s, true, lineCounter(rel, s, line)) {
					n++
				} else {
					u.unparsed = append(u.unparsed, fmt.Sprintf("%s:%d", rel, line))
				}
			}
			return false
		})
		return nil
	})
	require.NoError(t, err)
	return n
}

// constString returns the value of a string literal or of a + of them.
func constString(e ast.Expr) (string, token.Pos, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", 0, false
		}
		s, err := strconv.Unquote(e.Value)
		return s, e.Pos(), err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", 0, false
		}
		l, pos, ok := constString(e.X)
		if _, lit := e.X.(*ast.BasicLit); !ok || l == "x" && !lit {
			return "", 0, false
		}
		r, _, ok := constString(e.Y)
		return l + r, pos, ok
	case *ast.ParenExpr:
		return constString(e.X)
	case *ast.Ident, *ast.SelectorExpr, *ast.CallExpr:
		// A name spliced into the statement (a table, a quoted identifier).
		return "x", e.Pos(), true
	}
	return "", 0, false
}

// collectFunctions parses the bodies of the functions in schema pgrelay.
//
// It also returns the functions whose body is a string (parsed at each call,
// with the caller's search_path unless the function sets its own) that call
// a function or an operator without search_path = pg_catalog, pgrelay (with
// pg_temp last for the SECURITY DEFINER ones). A
// SQL-standard body (RETURN, BEGIN ATOMIC) was bound when it was created.
func (u *sqlUse) collectFunctions(t *testing.T, ctx context.Context, pool *pgxpool.Pool, builtins map[string]bool) (n int, unfixed []string) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT p.oid::regprocedure::text, l.lanname, p.prosrc, pg_get_functiondef(p.oid),
			p.prosqlbody IS NULL AND NOT coalesce(p.proconfig && ARRAY['search_path=pg_catalog, pgrelay', 'search_path=pg_catalog, pgrelay, pg_temp'], false)
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = 'pgrelay'::regnamespace ORDER BY 1`)
	require.NoError(t, err)
	type fn struct {
		name, lang, src, def string
		pathDependent        bool
	}
	var fns []fn
	for rows.Next() {
		var f fn
		require.NoError(t, rows.Scan(&f.name, &f.lang, &f.src, &f.def, &f.pathDependent))
		fns = append(fns, f)
	}
	require.NoError(t, rows.Err())
	none := func(int) string { return "" }
	for _, f := range fns {
		before := len(u.calls)
		switch {
		case f.lang == "sql" && strings.TrimSpace(f.src) != "":
			require.True(t, u.statement(t, builtins, f.name, f.src, false, none), "%s: body does not parse", f.name)
		case f.lang == "sql":
			// A SQL-standard body: its calls were bound when it was created.
			require.True(t, u.statement(t, builtins, f.name, f.def, false, none), "%s does not parse", f.name)
		case f.lang == "plpgsql":
			tree, err := pg_query.ParsePlPgSqlToJSON(f.def)
			require.NoError(t, err, f.name)
			var root any
			require.NoError(t, json.Unmarshal([]byte(tree), &root))
			for _, q := range plpgsqlQueries(root) {
				ok := u.statement(t, builtins, f.name, q, false, none) ||
					u.statement(t, builtins, f.name, "SELECT "+q, false, none)
				if !ok {
					if _, rhs, found := strings.Cut(q, ":="); found {
						ok = u.statement(t, builtins, f.name, "SELECT "+rhs, false, none)
					}
				}
				require.True(t, ok, "%s: %q does not parse", f.name, q)
			}
		default:
			t.Fatalf("%s: language %s", f.name, f.lang)
		}
		if f.pathDependent && len(u.calls) > before {
			unfixed = append(unfixed, f.name)
		}
	}
	return len(fns), unfixed
}

// plpgsqlQueries returns the SQL texts of a PL/pgSQL parse tree.
func plpgsqlQueries(v any) []string {
	var out []string
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			out = append(out, plpgsqlQueries(e)...)
		}
	case map[string]any:
		if e, ok := v["PLpgSQL_expr"]; ok {
			if q, ok := asMap(e)["query"].(string); ok {
				out = append(out, q)
			}
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = append(out, plpgsqlQueries(v[k])...)
		}
	}
	return out
}
