// Package samtemplate reads holdfast's template.yaml so that the local tools
// (the dev stack and the Lambda emulator runner) take their settings — each
// function's environment variables, timeouts and SQS event source settings —
// from the one place production takes them, instead of copies.
package samtemplate

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Template is the raw template with CloudFormation short-form tags turned
// into their long form ({"Ref": x}, {"Fn::Sub": x}, …).
type Template struct {
	Doc map[string]any
}

// Load reads and parses a SAM template.
func Load(path string) (*Template, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	doc, ok := convert(&n).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("template %s: not a mapping", path)
	}
	return &Template{Doc: doc}, nil
}

func convert(n *yaml.Node) any {
	var v any
	switch n.Kind {
	case yaml.DocumentNode:
		return convert(n.Content[0])
	case yaml.MappingNode:
		m := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			m[n.Content[i].Value] = convert(n.Content[i+1])
		}
		v = m
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		for i, c := range n.Content {
			s[i] = convert(c)
		}
		v = s
	case yaml.AliasNode:
		return convert(n.Alias)
	default:
		v = n.Value
	}
	if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
		name := strings.TrimPrefix(n.Tag, "!")
		if name == "Ref" || name == "Condition" {
			return map[string]any{name: v}
		}
		if name == "GetAtt" {
			if s, ok := v.(string); ok {
				parts := strings.SplitN(s, ".", 2)
				v = []any{parts[0], parts[len(parts)-1]}
			}
		}
		return map[string]any{"Fn::" + name: v}
	}
	return v
}

// Function is what the local tools need of one AWS::Serverless::Function.
type Function struct {
	LogicalID string
	Timeout   int                 // seconds
	Env       map[string]any      // variable -> raw value (a string, or an intrinsic)
	SQS       map[string]SQSEvent // event name -> settings
	Schedule  string              // a ScheduleV2/Schedule event's expression, e.g. "rate(1 minute)"
}

// SQSEvent is an SQS event source of a function.
type SQSEvent struct {
	QueueLogicalID          string
	BatchSize               int
	MaximumBatchingWindow   int // seconds
	MaximumConcurrency      int
	ReportBatchItemFailures bool
}

// Queue is what the local tools need of one AWS::SQS::Queue.
type Queue struct {
	LogicalID         string
	VisibilityTimeout int
	MaxReceiveCount   int    // 0 without a redrive policy
	DeadLetterQueue   string // logical id of the redrive target
}

func mapOf(v any) map[string]any { m, _ := v.(map[string]any); return m }

func intOf(v any, def int) int {
	switch x := v.(type) {
	case string:
		if n, err := strconv.Atoi(x); err == nil {
			return n
		}
	case int:
		return x
	}
	return def
}

// Functions returns every function with the Globals merged in.
func (t *Template) Functions() map[string]Function {
	globals := mapOf(mapOf(t.Doc["Globals"])["Function"])
	out := map[string]Function{}
	for id, r := range mapOf(t.Doc["Resources"]) {
		res := mapOf(r)
		if res["Type"] != "AWS::Serverless::Function" {
			continue
		}
		props := mapOf(res["Properties"])
		f := Function{LogicalID: id, Env: map[string]any{}, SQS: map[string]SQSEvent{}}
		f.Timeout = intOf(props["Timeout"], intOf(globals["Timeout"], 3))
		for _, src := range []map[string]any{globals, props} {
			for k, v := range mapOf(mapOf(mapOf(src)["Environment"])["Variables"]) {
				f.Env[k] = v
			}
		}
		for name, e := range mapOf(props["Events"]) {
			ev := mapOf(e)
			if ev["Type"] == "ScheduleV2" || ev["Type"] == "Schedule" {
				f.Schedule, _ = mapOf(ev["Properties"])["ScheduleExpression"].(string)
				continue
			}
			if ev["Type"] != "SQS" {
				continue
			}
			p := mapOf(ev["Properties"])
			s := SQSEvent{
				BatchSize:             intOf(p["BatchSize"], 10),
				MaximumBatchingWindow: intOf(p["MaximumBatchingWindowInSeconds"], 0),
				MaximumConcurrency:    intOf(mapOf(p["ScalingConfig"])["MaximumConcurrency"], 1000),
			}
			if ga, ok := mapOf(p["Queue"])["Fn::GetAtt"].([]any); ok && len(ga) > 0 {
				s.QueueLogicalID, _ = ga[0].(string)
			}
			if frt, ok := p["FunctionResponseTypes"].([]any); ok {
				for _, x := range frt {
					s.ReportBatchItemFailures = s.ReportBatchItemFailures || x == "ReportBatchItemFailures"
				}
			}
			f.SQS[name] = s
		}
		out[id] = f
	}
	return out
}

// Queues returns every SQS queue.
func (t *Template) Queues() map[string]Queue {
	out := map[string]Queue{}
	for id, r := range mapOf(t.Doc["Resources"]) {
		res := mapOf(r)
		if res["Type"] != "AWS::SQS::Queue" {
			continue
		}
		props := mapOf(res["Properties"])
		q := Queue{LogicalID: id, VisibilityTimeout: intOf(props["VisibilityTimeout"], 30)}
		if rp := mapOf(props["RedrivePolicy"]); rp != nil {
			q.MaxReceiveCount = intOf(rp["maxReceiveCount"], 0)
			if ga, ok := mapOf(rp["deadLetterTargetArn"])["Fn::GetAtt"].([]any); ok && len(ga) > 0 {
				q.DeadLetterQueue, _ = ga[0].(string)
			}
		}
		out[id] = q
	}
	return out
}

// Route is one HttpApi event of a function: a route of the HTTP API and the
// authorizer API Gateway runs before invoking the function.
type Route struct {
	Function string // logical id of the function the route invokes
	Method   string // upper case: "POST"
	Path     string // with parameters: "/reservations/{id}"
	// Authorizer names the route's authorizer: the event's Auth.Authorizer,
	// else the API's DefaultAuthorizer; "NONE" for none.
	Authorizer string
	// AuthType is "JWT" (an authorizer with a JwtConfiguration), "AWS_IAM",
	// "NONE", or "LAMBDA" (any other named authorizer).
	AuthType string
	// IdentityHeader is, for a JWT authorizer, the request header its token
	// comes from (IdentitySource $request.header.X; Authorization by default).
	IdentityHeader string
}

// Key returns the route key as API Gateway writes it: "GET /reservations/{id}".
func (r Route) Key() string { return r.Method + " " + r.Path }

// Routes returns every HttpApi route of every function, sorted by path and method.
func (t *Template) Routes() []Route {
	resources := mapOf(t.Doc["Resources"])
	var out []Route
	for id, r := range resources {
		res := mapOf(r)
		if res["Type"] != "AWS::Serverless::Function" {
			continue
		}
		for _, e := range mapOf(mapOf(res["Properties"])["Events"]) {
			ev := mapOf(e)
			if ev["Type"] != "HttpApi" {
				continue
			}
			p := mapOf(ev["Properties"])
			method, _ := p["Method"].(string)
			path, _ := p["Path"].(string)
			api := mapOf(mapOf(resources[refOf(p["ApiId"])])["Properties"])
			apiAuth := mapOf(api["Auth"])
			name, _ := mapOf(p["Auth"])["Authorizer"].(string)
			if name == "" {
				name, _ = apiAuth["DefaultAuthorizer"].(string)
			}
			route := Route{Function: id, Method: strings.ToUpper(method), Path: path, Authorizer: name}
			switch def := mapOf(mapOf(apiAuth["Authorizers"])[name]); {
			case name == "" || name == "NONE":
				route.Authorizer, route.AuthType = "NONE", "NONE"
			case name == "AWS_IAM":
				route.AuthType = "AWS_IAM"
			case def["JwtConfiguration"] != nil:
				route.AuthType = "JWT"
				route.IdentityHeader = "Authorization"
				if src, _ := def["IdentitySource"].(string); strings.HasPrefix(src, "$request.header.") {
					route.IdentityHeader = strings.TrimPrefix(src, "$request.header.")
				}
			default:
				route.AuthType = "LAMBDA"
			}
			out = append(out, route)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out
}

func refOf(v any) string { s, _ := mapOf(v)["Ref"].(string); return s }

// Rate returns the period of a "rate(N unit)" schedule expression.
func Rate(expr string) (time.Duration, error) {
	var n int
	var unit string
	if _, err := fmt.Sscanf(strings.TrimSuffix(strings.TrimPrefix(expr, "rate("), ")"), "%d %s", &n, &unit); err != nil || n < 1 {
		return 0, fmt.Errorf("schedule %q is not rate(N unit)", expr)
	}
	switch strings.TrimSuffix(unit, "s") {
	case "minute":
		return time.Duration(n) * time.Minute, nil
	case "hour":
		return time.Duration(n) * time.Hour, nil
	case "day":
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return 0, fmt.Errorf("schedule %q: unknown unit %q", expr, unit)
}

// EnvNames returns the sorted names of a function's environment variables.
func (f Function) EnvNames() []string {
	names := make([]string, 0, len(f.Env))
	for k := range f.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// Literal returns a variable's value when the template gives it as a plain
// string (not an intrinsic), and whether it does.
func (f Function) Literal(name string) (string, bool) {
	s, ok := f.Env[name].(string)
	return s, ok
}
