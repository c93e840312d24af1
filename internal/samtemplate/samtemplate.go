// Package samtemplate reads holdfast's template.yaml so that the local tools
// (the dev stack and the Lambda emulator runner) take their settings — each
// function's environment variables, timeouts and SQS event source settings —
// from the one place production takes them, instead of copies.
package samtemplate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

// Load reads and parses a SAM template, and replaces each AWS::Include of a
// local file (api/openapi.yaml) with that file's content, as `sam deploy`
// and CloudFormation do.
func Load(path string) (*Template, error) {
	doc, err := loadYAML(path)
	if err != nil {
		return nil, err
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("template %s: not a mapping", path)
	}
	resolved, err := includeLocal(m, filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	return &Template{Doc: resolved.(map[string]any)}, nil
}

func loadYAML(path string) (any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	return convert(&n), nil
}

// includeLocal replaces {"Fn::Transform": {"Name": "AWS::Include",
// "Parameters": {"Location": "<local path>"}}} with the included document.
func includeLocal(v any, dir string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if tr := mapOf(x["Fn::Transform"]); len(x) == 1 && tr["Name"] == "AWS::Include" {
			loc, _ := mapOf(tr["Parameters"])["Location"].(string)
			if loc == "" || strings.HasPrefix(loc, "s3://") {
				return x, nil
			}
			return loadYAML(filepath.Join(dir, loc))
		}
		for k, e := range x {
			r, err := includeLocal(e, dir)
			if err != nil {
				return nil, err
			}
			x[k] = r
		}
	case []any:
		for i, e := range x {
			r, err := includeLocal(e, dir)
			if err != nil {
				return nil, err
			}
			x[i] = r
		}
	}
	return v, nil
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

// Route is one route of the HTTP API: the function it invokes and the
// authorizer API Gateway runs first.
type Route struct {
	Function string // logical id of the function the route invokes
	Method   string // upper case: "POST"
	Path     string // with parameters: "/reservations/{id}"
	// Authorizer names the route's security scheme (the operation's, else
	// the document's); "NONE" for none.
	Authorizer string
	// AuthType is "JWT" (an x-amazon-apigateway-authorizer of type jwt),
	// "AWS_IAM" (awsSigv4), "NONE", or "LAMBDA" (any other scheme).
	AuthType string
	// IdentityHeader is, for a JWT authorizer, the request header its token
	// comes from (identitySource $request.header.X; Authorization by default).
	IdentityHeader string
	// Timeout is the invoked function's Timeout (Globals merged): how long
	// its invocation runs at most, whatever the client does meanwhile.
	Timeout time.Duration
}

// Key returns the route key as API Gateway writes it: "GET /reservations/{id}".
func (r Route) Key() string { return r.Method + " " + r.Path }

// Routes returns every route of the template's HTTP APIs, sorted by path and
// method: the paths of each AWS::Serverless::HttpApi's OpenAPI definition
// (api/openapi.yaml), the function each integration invokes and the
// authorizer its security scheme declares.
func (t *Template) Routes() []Route {
	resources := mapOf(t.Doc["Resources"])
	fns := t.Functions()
	var out []Route
	for _, r := range resources {
		res := mapOf(r)
		if res["Type"] != "AWS::Serverless::HttpApi" {
			continue
		}
		body := mapOf(mapOf(res["Properties"])["DefinitionBody"])
		schemes := mapOf(mapOf(body["components"])["securitySchemes"])
		for path, ops := range mapOf(body["paths"]) {
			for method, o := range mapOf(ops) {
				op := mapOf(o)
				if op == nil || method == "parameters" {
					continue
				}
				route := Route{Method: strings.ToUpper(method), Path: path, Authorizer: "NONE", AuthType: "NONE"}
				uri, _ := mapOf(mapOf(op["x-amazon-apigateway-integration"])["uri"])["Fn::Sub"].(string)
				if m := integrationFunction.FindStringSubmatch(uri); m != nil {
					route.Function = m[1]
					route.Timeout = time.Duration(fns[m[1]].Timeout) * time.Second
				}
				security, ok := op["security"].([]any)
				if !ok {
					security, _ = body["security"].([]any)
				}
				for _, req := range security {
					for name := range mapOf(req) {
						route.Authorizer = name
						scheme := mapOf(schemes[name])
						auth := mapOf(scheme["x-amazon-apigateway-authorizer"])
						switch {
						case scheme["x-amazon-apigateway-authtype"] == "awsSigv4":
							route.AuthType = "AWS_IAM"
						case auth["type"] == "jwt":
							route.AuthType = "JWT"
							route.IdentityHeader = "Authorization"
							if src, _ := auth["identitySource"].(string); strings.HasPrefix(src, "$request.header.") {
								route.IdentityHeader = strings.TrimPrefix(src, "$request.header.")
							}
						default:
							route.AuthType = "LAMBDA"
						}
					}
				}
				out = append(out, route)
			}
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

// integrationFunction finds the function a Lambda proxy integration's uri
// (…/functions/${ReserveFunction.Arn}/invocations) invokes.
var integrationFunction = regexp.MustCompile(`/functions/\$\{(\w+)\.Arn\}/invocations`)

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
