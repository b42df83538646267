package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"

	"github.com/courier-mq/courier/wire"
)

// Key and route expressions are CEL (https://cel.dev): a language made for
// untrusted expressions, whose every function has a cost model. A client
// declares them over the network, so each is bounded four ways:
//
//   - at declare time, an expression whose estimated cost on a reference
//     request (refSizes) is over the runtime cost limit is refused, and so
//     is one that calls a function outside allowedOverloads, whose cost
//     model was not reviewed, matches against a pattern that is not a
//     literal, or compares lists or maps;
//   - at run time, CEL counts the cost of every operation and stops the
//     evaluation past the cost limit; the cost of building a string or a
//     list is proportional to its size, so the limit also bounds what an
//     evaluation can allocate (see docs/operations.md, "Routing
//     expressions"). CEL charges a call once it ran: a sizeGuard charges
//     the calls whose work follows a string argument's size before;
//   - an expression with comprehensions (all, exists, map, filter...) runs
//     under a deadline, min(the time limit, the request's deadline), which
//     CEL checks between iterations;
//   - costly expressions (loops, patterns) run in one of the broker's
//     evaluation slots, GOMAXPROCS - 1, so that they leave a core free,
//     taken fairly between users (see Broker.takeSlot).
//
// The members variable is built once per set of handlers and shared by
// the evaluations (group.exprMembers): what an evaluation allocates is
// bounded by its cost alone, whatever the number of handlers.

// Default budgets of one evaluation. The cost limit is calibrated on the
// worst expressions we found (expr_test.go, TestExprWorstCase): the
// dearest allocate up to 25 bytes and take up to about 150 ns a unit of
// cost on a loaded 2-core machine, so 40,000 keeps an evaluation under
// 1 MiB and about 6 ms.
const (
	DefaultExprCost = 40_000
	DefaultExprTime = 10 * time.Millisecond
)

// maxExprSource bounds an expression's source, in code points.
const maxExprSource = 4096

// maxRegexProgram bounds the compiled size of a `matches` pattern, in RE2
// instructions: the cost model charges a match by the pattern's length,
// which a repetition such as a{1000} would otherwise dodge.
const maxRegexProgram = 512

// exprLimits are the budgets of one evaluation.
type exprLimits struct {
	cost uint64
	time time.Duration
}

// exprSizes are the largest sizes of the variables, in bytes and counts.
type exprSizes struct {
	key, tag, headers, headerName, headerValue, members, memberField uint64
}

// refSizes are the sizes of the reference request an expression's cost is
// estimated on at declare time. The wire allows more (any string up to the
// frame size, 4 MiB by default; members without a bound): a worst case
// over those would refuse even `key + "!"`. A request past these sizes
// is still bounded, by the runtime limit.
var refSizes = exprSizes{
	key: 1024, tag: 255, headers: wire.MaxHeaders, headerName: 255, headerValue: 1024,
	members: 1024, memberField: 255,
}

// allowedOverloads are the functions an expression may call: the standard
// library less timestamps and durations (their time zone argument reads
// files), and of the string extensions those whose result is never larger
// than their receiver. Each has a cost model, CEL's own or exprCostModels;
// replace, split, join, format and strings.quote are left out because
// they build a result many times the size of what they were charged for.
var allowedOverloads = map[string]bool{}

func init() {
	for _, ids := range []string{
		// operators
		"logical_not logical_and logical_or not_strictly_false __not_strictly_false__ conditional",
		"equals not_equals in_list in_map index_list index_map",
		"negate_double negate_int64 add_bytes add_double add_int64 add_list add_string add_uint64",
		"subtract_double subtract_int64 subtract_uint64 multiply_double multiply_int64 multiply_uint64",
		"divide_double divide_int64 divide_uint64 modulo_int64 modulo_uint64",
		// comparisons, all but timestamps and durations
		"less_bool less_bytes less_double less_double_int64 less_double_uint64 less_int64 less_int64_double",
		"less_int64_uint64 less_string less_uint64 less_uint64_double less_uint64_int64",
		"less_equals_bool less_equals_bytes less_equals_double less_equals_double_int64 less_equals_double_uint64",
		"less_equals_int64 less_equals_int64_double less_equals_int64_uint64 less_equals_string less_equals_uint64",
		"less_equals_uint64_double less_equals_uint64_int64",
		"greater_bool greater_bytes greater_double greater_double_int64 greater_double_uint64 greater_int64",
		"greater_int64_double greater_int64_uint64 greater_string greater_uint64 greater_uint64_double greater_uint64_int64",
		"greater_equals_bool greater_equals_bytes greater_equals_double greater_equals_double_int64",
		"greater_equals_double_uint64 greater_equals_int64 greater_equals_int64_double greater_equals_int64_uint64",
		"greater_equals_string greater_equals_uint64 greater_equals_uint64_double greater_equals_uint64_int64",
		// conversions
		"bool_to_bool string_to_bool bytes_to_bytes string_to_bytes to_dyn type",
		"double_to_double int64_to_double string_to_double uint64_to_double",
		"double_to_int64 int64_to_int64 string_to_int64 uint64_to_int64",
		"double_to_uint64 int64_to_uint64 string_to_uint64 uint64_to_uint64",
		"bool_to_string bytes_to_string double_to_string int64_to_string string_to_string uint64_to_string",
		// strings, sizes, patterns
		"contains_string starts_with_string ends_with_string matches matches_string",
		"bytes_size list_size map_size size_bytes size_list size_map size_string string_size",
		// string extensions
		"string_char_at_int string_index_of_string string_index_of_string_int string_last_index_of_string",
		"string_last_index_of_string_int string_lower_ascii string_upper_ascii string_trim",
		"string_substring_int string_substring_int_int",
	} {
		for _, id := range strings.Fields(ids) {
			allowedOverloads[id] = true
		}
	}
}

// regexCostFactor is the cost of a match per byte of the string scanned
// and character of the pattern, before the string traversal factor.
const regexCostFactor = 1.0

// exprCostModels price the standard functions CEL counts as O(1) that are
// not: a string's size counts its code points, and a failed conversion
// copies its argument into the error.
func exprCostModels() []cost.OverloadModel {
	scan := func(id string, member bool, size cost.QuantityExpr) cost.OverloadModel {
		c := cost.EvalCost(cost.Sum(cost.Const(1), cost.Scale(size, cost.StringTraversalCostFactor)))
		if member {
			return cost.MemberOverload(id, c)
		}
		return cost.Overload(id, c)
	}
	// A match is charged by the pattern's length as CEL does, but 4 times
	// as dear: measured, RE2 takes 4 times as long per unit of CEL's cost
	// as the other string functions.
	match := func(s, pattern cost.QuantityExpr) cost.OverloadModelOption {
		return cost.EvalCost(cost.Mul(cost.Scale(cost.Sum(s, cost.Const(1)), cost.StringTraversalCostFactor), cost.Scale(pattern, regexCostFactor)))
	}
	return []cost.OverloadModel{
		cost.Overload("matches", match(cost.Arg(0), cost.Arg(1))),
		cost.MemberOverload("matches_string", match(cost.Target(), cost.Arg(0))),
		scan("size_string", false, cost.Arg(0)),
		scan("string_size", true, cost.Target()),
		scan("string_to_int64", false, cost.Arg(0)),
		scan("string_to_uint64", false, cost.Arg(0)),
		scan("string_to_double", false, cost.Arg(0)),
		scan("string_to_bool", false, cost.Arg(0)),
	}
}

// exprEnv is the environment every expression is compiled against. At
// run time it sizes values in bytes (aggregate sizing), so that the cost
// of building a string follows its memory; estimateEnv is the same but
// sizes by count (default sizing), for the estimate at declare: aggregate
// sizing takes a list of n bytes for one of up to n elements, and makes
// any loop look n times dearer than it can be.
var exprEnv, estimateEnv = newExprEnv(cost.AggregateSizingStrategy()), newExprEnv(cost.DefaultSizingStrategy())

func newExprEnv(sizing cost.SizingStrategy) *cel.Env {
	env, err := cel.NewEnv(
		cel.Variable("key", cel.StringType),
		cel.Variable("headers", cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable("size", cel.IntType),
		cel.Variable("tag", cel.StringType),
		cel.Variable("members", cel.ListType(cel.MapType(cel.StringType, cel.StringType))),
		ext.Strings(),
		cel.CostSizingStrategy(sizing),
		cel.CostModel(exprCostModels()...),
		cel.ParserExpressionSizeLimit(maxExprSource),
		cel.RegexProgramSizeLimit(maxRegexProgram),
	)
	if err != nil {
		panic(fmt.Sprintf("broker: CEL environment: %v", err))
	}
	return env
}

// exprLimitError is an evaluation stopped by one of its limits.
type exprLimitError struct{ msg string }

func (e *exprLimitError) Error() string { return e.msg }

// expr is a compiled key or route expression.
type expr struct {
	prog cel.Program
	lim  exprLimits
	// loops is set when the expression has comprehensions, the only
	// place CEL checks for a deadline: others are bounded by cost alone
	// and spared the context.
	loops bool
	// estimate is the worst-case cost on the reference request.
	estimate uint64
	// redirects are the literal targets of the route's redirects.
	redirects []string
	// costly is set when an evaluation may take long: loops, patterns,
	// or an estimate over cheapCost. It then waits for one of the
	// broker's evaluation slots (see Broker.evalSlot).
	costly bool
	// guards price, by the id of an argument, the call that takes it,
	// per byte of the argument (see sizeGuard).
	guards map[int64]float64
}

// compileExpr compiles and vets a key or route expression: the two differ
// only in what their result may be, which is checked when it is read.
func compileExpr(src string, lim exprLimits) (*expr, error) {
	return buildExpr(src, lim, true)
}

// buildExpr is compileExpr; estimate false skips the static cost check,
// for tests of the runtime limits.
func buildExpr(src string, lim exprLimits, estimate bool) (*expr, error) {
	checked, err := checkExpr(src)
	if err != nil {
		return nil, err
	}
	native := checked.NativeRep()
	e := &expr{lim: lim}
	if err := e.vet(native); err != nil {
		return nil, err
	}
	est, err := estimateEnv.EstimateCost(checked, sizeEstimator{refSizes})
	if err != nil {
		return nil, fmt.Errorf("estimating its cost: %w", err)
	}
	e.estimate = est.Max
	e.costly = e.costly || e.loops || est.Max > cheapCost
	if estimate && est.Max > lim.cost {
		return nil, fmt.Errorf("too costly: its cost on a request with a %d-byte key, %d headers of %d bytes and %d members could reach %s, over the limit of %d",
			refSizes.key, refSizes.headers, refSizes.headerValue, refSizes.members, costString(est.Max), lim.cost)
	}
	opts := []cel.ProgramOption{cel.CostLimit(lim.cost), cel.CustomDecoratorV2(e.guard)}
	if e.loops {
		opts = append(opts, cel.InterruptCheckFrequency(interruptEvery))
	}
	e.prog, err = exprEnv.Program(checked, opts...)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// checkExpr parses and type-checks src.
func checkExpr(src string) (*cel.Ast, error) {
	if n := utf8.RuneCountInString(src); n > maxExprSource {
		return nil, fmt.Errorf("expression of %d characters, limit %d", n, maxExprSource)
	}
	parsed, iss := exprEnv.Parse(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	dynResult(parsed.NativeRep())
	checked, iss := exprEnv.Check(parsed)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	return checked, nil
}

// cheapCost is the estimate under which an expression without loops or
// patterns runs without waiting for an evaluation slot: at most a few
// microseconds.
const cheapCost = 1000

// interruptEvery is how many comprehension iterations CEL runs between
// two looks at the deadline; one iteration is bounded by the cost limit.
const interruptEvery = 16

func costString(c uint64) string {
	if c == math.MaxUint64 {
		return "any amount (it grows without bound)"
	}
	return fmt.Sprint(c)
}

// dynResult lets the branches of a conditional that gives the result have
// different types (`size > 10 ? {"reject": "big"} : null`), which CEL's
// checker refuses: each such branch is wrapped in dyn().
func dynResult(a *ast.AST) {
	fac := ast.NewExprFactory()
	next := ast.MaxID(a)
	var wrap func(e ast.Expr)
	wrap = func(e ast.Expr) {
		if e.Kind() == ast.CallKind && e.AsCall().FunctionName() == "_?_:_" && len(e.AsCall().Args()) == 3 {
			args := e.AsCall().Args()
			wrap(args[1])
			wrap(args[2])
			return
		}
		inner := fac.NewUnspecifiedExpr(next)
		next++
		inner.SetKindCase(e)
		e.SetKindCase(fac.NewCall(0, "dyn", inner))
	}
	root := a.Expr()
	if root.Kind() == ast.CallKind && root.AsCall().FunctionName() == "_?_:_" {
		wrap(root)
	}
}

// vet refuses what the cost model cannot price, and records what the
// expression contains.
func (e *expr) vet(a *ast.AST) error {
	var err error
	refs := a.ReferenceMap()
	visit := func(n ast.NavigableExpr) {
		if err != nil {
			return
		}
		switch n.Kind() {
		case ast.ComprehensionKind:
			e.loops = true
		case ast.CallKind:
			call := n.AsCall()
			ref := refs[n.ID()]
			if ref == nil {
				err = fmt.Errorf("function %s is not available", call.FunctionName())
				return
			}
			for _, id := range ref.OverloadIDs {
				if !allowedOverloads[id] {
					err = fmt.Errorf("function %s (%s) is not available in routing expressions", call.FunctionName(), id)
					return
				}
			}
			if err = e.guardCall(call, ref.OverloadIDs); err != nil {
				return
			}
			err = checkEquality(a, call, ref.OverloadIDs)
		case ast.MapKind:
			for _, ent := range n.AsMap().Entries() {
				en := ent.AsMapEntry()
				if s, ok := literalString(en.Key()); ok && s == "redirect" {
					if t, ok := literalString(en.Value()); ok {
						e.redirects = append(e.redirects, t)
					}
				}
			}
		}
	}
	ast.PostOrderVisit(ast.NavigateAST(a), ast.NewExprVisitor(func(x ast.Expr) {
		visit(x.(ast.NavigableExpr))
	}))
	return err
}

// perByte prices, per byte of their first argument (or receiver), the
// calls that take time or memory in proportion to it: charged before the
// call rather than after, so that one call on a long string cannot go
// far past the limit. It is the call's cost model, rounded up.
var perByte = map[string]float64{
	"string_lower_ascii": 1.1, "string_upper_ascii": 1.1, "string_trim": 1.1,
	"string_substring_int": 1.1, "string_substring_int_int": 1.1, "string_char_at_int": 0.1,
	"string_index_of_string": 0.1, "string_index_of_string_int": 0.1,
	"string_last_index_of_string": 0.1, "string_last_index_of_string_int": 0.1,
	"size_string": 0.1, "string_size": 0.1, "string_to_bytes": 0.1, "bytes_to_string": 0.1,
	"string_to_int64": 0.1, "string_to_uint64": 0.1, "string_to_double": 0.1, "string_to_bool": 0.1,
	"add_string": 0.1, "add_bytes": 0.1,
}

// guardCall records the guards of a call, and checks its pattern if it
// is a match.
func (e *expr) guardCall(call ast.CallExpr, overloads []string) error {
	args := call.Args()
	if call.IsMemberFunction() {
		args = append([]ast.Expr{call.Target()}, args...)
	}
	if len(args) == 0 {
		return nil
	}
	for _, id := range overloads {
		switch id {
		case "matches", "matches_string":
			pattern, ok := literalString(args[len(args)-1])
			if !ok {
				return errors.New("matches needs a literal pattern (a string in quotes), compiled once at declare")
			}
			n, err := types.RegexProgramSize(pattern)
			if err != nil {
				return err
			}
			if n > 4*len(pattern)+16 {
				return fmt.Errorf("pattern %q compiles to %d instructions, more than 4 per character: use fewer counted repetitions", pattern, n)
			}
			e.costly = true
			// The cost model charges by the pattern's length; the
			// guard by its compiled size, which the match time follows.
			e.addGuard(args[0].ID(), cost.StringTraversalCostFactor*regexCostFactor*float64(max(n, len(pattern))))
		case "add_string", "add_bytes":
			e.addGuard(args[0].ID(), perByte[id])
			e.addGuard(args[1].ID(), perByte[id])
		default:
			if f, ok := perByte[id]; ok {
				e.addGuard(args[0].ID(), f)
			}
		}
	}
	return nil
}

// checkEquality refuses == and != on lists, maps or dyn values: CEL
// charges them by size, but comparing maps element by element allocates
// far more per unit than anything else (77 bytes, measured).
func checkEquality(a *ast.AST, call ast.CallExpr, overloads []string) error {
	for _, id := range overloads {
		if id != "equals" && id != "not_equals" {
			continue
		}
		for _, arg := range call.Args() {
			switch a.GetType(arg.ID()).Kind() {
			case types.ListKind, types.MapKind, types.DynKind:
				return fmt.Errorf("%s compares lists, maps or values of unknown type; compare their elements", call.FunctionName())
			}
		}
	}
	return nil
}

func (e *expr) addGuard(id int64, factor float64) {
	if e.guards == nil {
		e.guards = make(map[int64]float64)
	}
	e.guards[id] = max(e.guards[id], factor)
}

// guard is the decorator that puts a sizeGuard on the arguments of
// guarded calls.
func (e *expr) guard(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	if f, ok := e.guards[i.ID()]; ok {
		return &sizeGuard{InterpretableV2: i, factor: f}, nil
	}
	return i, nil
}

// sizeGuard is an argument of a call whose cost grows with the argument's
// size: once the argument is evaluated, the evaluation stops if the call
// would take it over its cost limit. CEL charges a call after it ran; so
// a call on a 4 MiB string would run (and allocate) in full first.
type sizeGuard struct {
	interpreter.InterpretableV2
	factor float64
}

// Exec implements [interpreter.InterpretableV2].
func (g *sizeGuard) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	v := g.InterpretableV2.Exec(frame)
	t := frame.CostTracker()
	if t == nil || t.Limit == nil {
		return v
	}
	var n int
	switch s := v.(type) {
	case types.String:
		n = len(s)
	case types.Bytes:
		n = len(s)
	default:
		return v
	}
	if float64(t.ActualCost())+g.factor*float64(n) > float64(*t.Limit) {
		panic(cost.LimitExceededError{Message: "operation cancelled: actual cost limit exceeded"})
	}
	return v
}

// Eval implements [interpreter.Interpretable].
func (g *sizeGuard) Eval(vars interpreter.Activation) ref.Val {
	return interpreter.EvalActivation(vars, g.Exec)
}

func literalString(e ast.Expr) (string, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}

// sizeEstimator sizes the variables for the cost estimate.
type sizeEstimator struct{ exprSizes }

// EstimateSize implements [cost.Estimator].
func (z sizeEstimator) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	p := n.Path()
	if len(p) == 0 {
		return nil
	}
	var max uint64
	switch strings.Join(p, "/") {
	case "key":
		max = z.key
	case "tag":
		max = z.tag
	case "headers":
		max = z.headers
	case "headers/@keys":
		max = z.headerName
	case "headers/@values":
		max = z.headerValue
	case "members":
		max = z.members
	default:
		if p[0] == "members" && len(p) == 2 {
			max = 3 // a member's map: id, tag, conn_tag
		} else if p[0] == "members" && len(p) == 3 {
			max = z.memberField
		} else {
			return nil
		}
	}
	return &cost.SizeEstimate{Min: 0, Max: max}
}

// EstimateCallCost implements [cost.Estimator]: the cost models decide.
func (sizeEstimator) EstimateCallCost(function, overloadID string, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
	return nil
}

// exprVars is the activation of one evaluation. Each variable is made a
// CEL value on its first read, once: a loop reads them again and again.
// members comes from g, the handlers the request may go to, when set
// (the broker's requests); else from in.Members (tests).
type exprVars struct {
	in                         *RouteInput
	g                          *group
	key, headers, tag, members ref.Val
}

// exprVarsOf is the activation of an evaluation on request f, which may
// go to the handlers of g. Unlike [routeInput] it lists no members: the
// expression reads g's, built once for all requests.
func exprVarsOf(f *wire.Frame, g *group) *exprVars {
	return &exprVars{in: &RouteInput{Key: f.Key, Header: f.Header, Size: len(f.Body), Tag: f.Tag}, g: g}
}

// exprMembers returns the handlers of g as the members variable of an
// expression: a list of maps of id, tag and conn_tag. It is built by the
// first evaluation that reads it (about 400 bytes a handler), and shared
// by the others, read-only, until the handlers change and a new view
// replaces g: a request allocates nothing for it, however many handlers
// the exchange has.
func (g *group) exprMembers() ref.Val {
	g.exprOnce.Do(func() {
		list := make([]ref.Val, len(g.members))
		for i, m := range g.members {
			list[i] = memberVal(m.member, m.serviceTag, m.connTag)
		}
		g.exprList = types.NewRefValList(types.DefaultTypeAdapter, list)
	})
	return g.exprList
}

// memberVal is one element of the members variable.
func memberVal(id, tag, connTag string) ref.Val {
	return types.NewStringStringMap(types.DefaultTypeAdapter, map[string]string{"id": id, "tag": tag, "conn_tag": connTag})
}

// ResolveName implements [interpreter.Activation].
func (v *exprVars) ResolveName(name string) (any, bool) {
	switch name {
	case "key":
		if v.key == nil {
			v.key = types.String(v.in.Key)
		}
		return v.key, true
	case "headers":
		if v.headers == nil {
			h := v.in.Header
			if h == nil {
				h = map[string]string{}
			}
			v.headers = types.NewStringStringMap(types.DefaultTypeAdapter, h)
		}
		return v.headers, true
	case "size":
		return types.Int(v.in.Size), true
	case "tag":
		if v.tag == nil {
			v.tag = types.String(v.in.Tag)
		}
		return v.tag, true
	case "members":
		if v.members == nil && v.g != nil {
			v.members = v.g.exprMembers()
		} else if v.members == nil {
			list := make([]ref.Val, len(v.in.Members))
			for i, m := range v.in.Members {
				list[i] = memberVal(m.ID, m.ServiceTag, m.ConnTag)
			}
			v.members = types.NewRefValList(types.DefaultTypeAdapter, list)
		}
		return v.members, true
	}
	return nil, false
}

// Parent implements [interpreter.Activation].
func (*exprVars) Parent() interpreter.Activation { return nil }

// eval evaluates e on vars. left is what remains of the request's own
// deadline (0: none). An evaluation stopped by a limit fails with an
// *exprLimitError.
func (e *expr) eval(vars *exprVars, left time.Duration) (ref.Val, error) {
	if !e.loops {
		out, _, err := e.prog.Eval(vars)
		return out, e.limitErr(err)
	}
	d, own := e.lim.time, false
	if left != 0 && left < d {
		d, own = max(left, 1), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out, _, err := e.prog.ContextEval(ctx, vars)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		if own {
			return nil, &exprLimitError{fmt.Sprintf("ran past the request's deadline (%s)", d.Round(time.Microsecond))}
		}
		return nil, &exprLimitError{fmt.Sprintf("ran longer than its time limit (%s)", d)}
	}
	return out, e.limitErr(err)
}

// limitErr turns CEL's cost limit error into an *exprLimitError.
func (e *expr) limitErr(err error) error {
	var cancelled interpreter.EvalCancelledError
	if errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded {
		return &exprLimitError{fmt.Sprintf("went over its cost limit (%d)", e.lim.cost)}
	}
	return err
}

// key evaluates a key expression: a string, or a scalar printed as one.
func (e *expr) key(vars *exprVars, left time.Duration) (string, error) {
	out, err := e.eval(vars, left)
	if err != nil {
		return "", err
	}
	switch v := out.(type) {
	case types.String:
		return string(v), nil
	case types.Null:
		return "", nil
	}
	s := out.ConvertToType(types.StringType)
	if str, ok := s.(types.String); ok {
		return string(str), nil
	}
	return "", fmt.Errorf("key expression gave %s; want a string", out.Type().TypeName())
}

// route evaluates a route expression.
func (e *expr) route(vars *exprVars, left time.Duration) (Route, error) {
	out, err := e.eval(vars, left)
	if err != nil {
		return Route{}, err
	}
	return routeOf(out)
}

// routeOf reads a route expression's result: null (any handler), a
// member id, or a map with the keys member, tag, redirect, reject, key
// and headers.
func routeOf(out ref.Val) (Route, error) {
	var r Route
	switch v := out.(type) {
	case types.Null:
		return r, nil
	case types.String:
		r.Member = string(v)
		return r, nil
	case traits.Mapper:
		it := v.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			x := v.Get(k)
			name, ok := k.(types.String)
			if !ok {
				return r, fmt.Errorf("route keys must be strings, got %s", typeName(k))
			}
			if err := setRoute(&r, string(name), x); err != nil {
				return r, err
			}
		}
		return r, nil
	}
	return r, fmt.Errorf("route expression gave %s; want null, a member id or a map", typeName(out))
}

// setRoute sets the field name of r to x.
func setRoute(r *Route, name string, x ref.Val) error {
	if name == "headers" {
		h, ok := x.(traits.Mapper)
		if !ok {
			return fmt.Errorf("headers must be a map, got %s", typeName(x))
		}
		r.Header = make(map[string]string)
		it := h.Iterator()
		for it.HasNext() == types.True {
			hk := it.Next()
			hv, err := scalarString(h.Get(hk))
			ks, ok := hk.(types.String)
			if err != nil || !ok {
				return fmt.Errorf("headers must map strings to strings or numbers, got %s: %s", typeName(hk), typeName(h.Get(hk)))
			}
			r.Header[string(ks)] = hv
		}
		return nil
	}
	if name == "key" {
		s, err := scalarString(x)
		if err != nil {
			return fmt.Errorf("route key: %w", err)
		}
		r.Key = &s
		return nil
	}
	s, ok := x.(types.String)
	if !ok {
		return fmt.Errorf("route %q must be a string, got %s", name, typeName(x))
	}
	switch name {
	case "member":
		r.Member = string(s)
	case "tag":
		r.Tag = string(s)
	case "redirect":
		r.Redirect = string(s)
	case "reject":
		r.Reject = string(s)
	default:
		return fmt.Errorf("unknown route key %q (member, tag, redirect, reject, key, headers)", name)
	}
	return nil
}

// scalarString prints a string, number or bool.
func scalarString(x ref.Val) (string, error) {
	switch x.(type) {
	case types.String, types.Int, types.Uint, types.Double, types.Bool:
		if s, ok := x.ConvertToType(types.StringType).(types.String); ok {
			return string(s), nil
		}
	}
	return "", fmt.Errorf("want a string or a number, got %s", typeName(x))
}

func typeName(v ref.Val) string {
	if v == nil {
		return "nothing"
	}
	return v.Type().TypeName()
}
