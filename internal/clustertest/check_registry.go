package clustertest

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"
)

// RegistryKind is an operation on the exchange registry.
type RegistryKind string

// The registry operations.
const (
	Declare RegistryKind = "declare"
	Delete  RegistryKind = "delete"
	Get     RegistryKind = "get"
)

// Outcome is what a registry operation returned.
type Outcome string

// Registry outcomes. Which ones a client records depends on what the API
// tells it: OK where it cannot tell whether the operation changed
// anything (an idempotent declare), the precise ones where it can.
const (
	// OutcomeOK: the operation succeeded; it says nothing of the state
	// before.
	OutcomeOK Outcome = "ok"
	// OutcomeCreated: a declare made the exchange (it was absent).
	OutcomeCreated Outcome = "created"
	// OutcomeExists: a declare found the exchange there already, or a
	// get found it.
	OutcomeExists Outcome = "exists"
	// OutcomeDeleted: a delete removed an exchange that was there.
	OutcomeDeleted Outcome = "deleted"
	// OutcomeNotFound: a get or delete found no exchange.
	OutcomeNotFound Outcome = "not-found"
	// OutcomeUnknown: the client cannot tell (timeout, lost connection);
	// the operation may have taken effect or not. Record it with Return
	// = [Forever].
	OutcomeUnknown Outcome = "unknown"
	// OutcomeFailed: the operation failed without effect (refused by
	// the cluster, for example "no quorum").
	OutcomeFailed Outcome = "failed"
)

// RegistryOp is one declare, delete or get of an exchange by name, with
// the times of its call and return.
type RegistryOp struct {
	Client  int          `json:"client"`
	Node    string       `json:"node,omitempty"`
	Kind    RegistryKind `json:"kind"`
	Name    string       `json:"name"`
	Outcome Outcome      `json:"outcome"`
	Call    int64        `json:"call_ns"`
	Return  int64        `json:"return_ns"`
}

// registryModel is one name of the exchange registry: the state is
// whether the exchange exists. Names are independent, so [CheckRegistry]
// checks each name's operations alone.
var registryModel = porcupine.Model{
	Init: func() any { return false },
	Step: func(state, input, output any) (bool, any) {
		return registryStep(state.(bool), input.(RegistryOp).Kind, output.(Outcome))
	},
	DescribeOperation: func(input, output any) string {
		op := input.(RegistryOp)
		return fmt.Sprintf("%s(%s) -> %s", op.Kind, op.Name, output.(Outcome))
	},
	DescribeState: func(state any) string {
		if state.(bool) {
			return "exists"
		}
		return "absent"
	},
}

// registryStep is the sequential specification of one exchange name.
func registryStep(exists bool, kind RegistryKind, out Outcome) (bool, any) {
	switch kind {
	case Declare:
		switch out {
		case OutcomeOK, OutcomeUnknown:
			return true, true
		case OutcomeCreated:
			return !exists, true
		case OutcomeExists:
			return exists, true
		}
	case Delete:
		switch out {
		case OutcomeOK, OutcomeUnknown:
			return true, false
		case OutcomeDeleted:
			return exists, false
		case OutcomeNotFound:
			return !exists, false
		}
	case Get:
		switch out {
		case OutcomeExists:
			return exists, exists
		case OutcomeNotFound:
			return !exists, exists
		case OutcomeUnknown:
			return true, exists
		}
	}
	return false, exists
}

// CheckRegistry checks that the registry operations of s are
// linearizable, giving porcupine at most timeout (0: one minute).
// Failed operations had no effect and are left out; operations of
// unknown outcome may have taken effect at any time after their call. A
// violation names the exchange whose history is not linearizable; a
// check that runs out of time is Unknown, not a pass.
func CheckRegistry(s Snapshot, timeout time.Duration) Result {
	if timeout <= 0 {
		timeout = time.Minute
	}
	r := Result{Checker: "registry"}
	byName := map[string][]porcupine.Operation{}
	var names []string
	unknown, total := 0, 0
	for _, op := range s.Registry {
		switch {
		case op.Outcome == OutcomeFailed:
			continue
		case op.Outcome == OutcomeUnknown && op.Kind == Get:
			continue // a read of unknown outcome constrains nothing
		case op.Outcome == OutcomeUnknown:
			unknown++
			op.Return = Forever
		}
		if _, ok := byName[op.Name]; !ok {
			names = append(names, op.Name)
		}
		total++
		byName[op.Name] = append(byName[op.Name], porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: op.Outcome, Return: op.Return})
	}
	r.Checked = fmt.Sprintf("%d declare/delete/get operations on %d exchanges are linearizable (%d of unknown outcome)", total, len(names), unknown)
	deadline := time.Now().Add(timeout)
	for _, name := range names {
		left := time.Until(deadline)
		if left <= 0 {
			r.Unknown = true
			r.note("porcupine did not decide within %v; exchanges from %q on were not checked", timeout, name)
			break
		}
		res, info := porcupine.CheckOperationsVerbose(registryModel, byName[name], left)
		switch res {
		case porcupine.Ok:
		case porcupine.Unknown:
			r.Unknown = true
			r.note("porcupine did not decide on exchange %q within %v", name, timeout)
		default:
			r.violate("exchange %q: not linearizable: %s", name, describeIllegal(info))
		}
	}
	return r
}

// describeIllegal tells where the longest linearizable prefix of a
// name's history stops.
func describeIllegal(info porcupine.LinearizationInfo) string {
	best := []porcupine.Operation(nil)
	for _, p := range info.PartialLinearizationsOperations() {
		for _, lin := range p {
			if len(lin) > len(best) {
				best = lin
			}
		}
	}
	if len(best) == 0 {
		return "no operation can come first"
	}
	last := best[len(best)-1]
	op := last.Input.(RegistryOp)
	return fmt.Sprintf("the longest linearizable prefix has %d operations and ends with %s -> %s by client %d (called at %s)",
		len(best), op.Kind, last.Output, op.Client, ms(op.Call))
}
