package samtemplate_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/samtemplate"
)

// emittedMetrics are the holdfast metrics the code writes: every literal
// Count("name", …) in shared/, and cancelled_<reason> for every reason.
func emittedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	count := regexp.MustCompile(`\.Count\("([a-z_]+)"`)
	reason := regexp.MustCompile(`Reason = "([a-z_]+)"`)
	err := filepath.Walk(filepath.Join(root, "shared"), func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range count.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		for _, m := range reason.FindAllStringSubmatch(string(b), -1) {
			out["cancelled_"+m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("found only %v in the code", out)
	}
	return out
}

// emittedBy names the functions whose Recorder counts each holdfast metric
// the dashboard or an alarm reads (the Function dimension is the function's
// name): a widget reading "confirmed" by reserve would show nothing.
var emittedBy = map[string][]string{
	"reserved": {"reserve"}, "sold_out": {"reserve"}, "rate_limited": {"reserve"}, "publish_failed": {"reserve"},
	"not_open": {"reserve"}, "sale_closed": {"reserve"},
	"confirmed": {"persist"}, "persist_retries": {"persist"}, "strays": {"persist"},
	"records": {"persist", "compensate"}, "batches": {"persist", "compensate"},
	"item_failures": {"persist", "compensate"}, "poison_messages": {"persist", "compensate"},
	"cancelled_dead_letter": {"compensate"},
	"transfer_failed":       {"reserve", "sweeper"},
	"drift_units":           {"sweeper"}, "drift_healed": {"sweeper"}, "outbox_lag_seconds": {"sweeper"}, "swept_expired": {"sweeper"}, "sweep_errors": {"sweeper"},
	"ledger_mismatch": {"sweeper"},
}

// stat is a CloudWatch statistic a widget or alarm may use.
var stat = regexp.MustCompile(`^(Sum|Average|Minimum|Maximum|SampleCount|p\d{1,2}(\.\d+)?|p100)$`)

// awsMetrics are the AWS metrics the dashboard and alarms may use, with the
// dimension each is read by and the resource type that dimension names.
var awsMetrics = map[string]struct {
	names []string
	dims  map[string]string // dimension -> resource type of its value ("" for a parameter)
}{
	"AWS/ApiGateway": {[]string{"Latency", "IntegrationLatency", "Count", "4xx", "5xx"}, map[string]string{"ApiId": "AWS::Serverless::HttpApi", "Stage": ""}},
	"AWS/Lambda":     {[]string{"Invocations", "Errors", "Throttles", "Duration", "ConcurrentExecutions"}, map[string]string{"FunctionName": "AWS::Serverless::Function"}},
	"AWS/SQS": {[]string{"ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible", "ApproximateAgeOfOldestMessage",
		"NumberOfMessagesReceived", "NumberOfMessagesSent", "NumberOfMessagesDeleted"}, map[string]string{"QueueName": "AWS::SQS::Queue"}},
	// Per node: CacheClusterId is <replication group>-00N (or -000S-00N).
	"AWS/ElastiCache": {[]string{"DatabaseMemoryUsagePercentage", "EngineCPUUtilization", "CurrConnections"}, map[string]string{"CacheClusterId": "AWS::ElastiCache::ReplicationGroup"}},
}

// Every widget of the dashboard shows a metric the code emits or AWS
// publishes, for this stage's resources; each widget the operations guide
// names exists.
func TestDashboardShowsRealMetrics(t *testing.T) {
	doc := translated(t)
	res := m(doc["Resources"])
	raw, _ := m(m(m(res["Dashboard"])["Properties"])["DashboardBody"])["Fn::Sub"].(string)
	if raw == "" {
		t.Fatal("no Dashboard with a DashboardBody in the template")
	}
	// The raw template's resource types (SAM's, before the transform).
	tplRes := rawResources(t)
	placeholder := regexp.MustCompile(`\$\{([A-Za-z:]+)(\.[A-Za-z]+)?\}`)
	for _, p := range placeholder.FindAllStringSubmatch(raw, -1) {
		name := p[1]
		if !strings.HasPrefix(name, "AWS::") && tplRes[name] == "" && m(doc["Parameters"])[name] == nil {
			t.Errorf("the dashboard refers to ${%s}, which the template does not declare", name)
		}
	}
	body := placeholder.ReplaceAllString(raw, "$1")
	var dash struct {
		Widgets []struct {
			Properties struct {
				Title   string
				Metrics [][]any
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &dash); err != nil {
		t.Fatalf("DashboardBody is not JSON: %v", err)
	}
	emitted := emittedMetrics(t)
	titles := map[string]bool{}
	for _, w := range dash.Widgets {
		titles[w.Properties.Title] = true
		if len(w.Properties.Metrics) == 0 {
			t.Errorf("widget %q shows nothing", w.Properties.Title)
		}
		ids := map[string]bool{}
		var exprs []string
		for _, metric := range w.Properties.Metrics {
			opts, _ := metric[len(metric)-1].(map[string]any)
			if id, ok := opts["id"].(string); ok {
				ids[id] = true
			}
			if e, ok := opts["expression"].(string); ok {
				exprs = append(exprs, e)
			}
			if st, ok := opts["stat"].(string); ok && !stat.MatchString(st) {
				t.Errorf("widget %q: statistic %q is not one CloudWatch knows", w.Properties.Title, st)
			}
		}
		for _, e := range exprs {
			for _, ref := range regexp.MustCompile(`\b[a-z][a-z0-9]*\b`).FindAllString(e, -1) {
				if !ids[ref] && ref != "m" && !strings.Contains("if period", ref) {
					t.Errorf("widget %q: expression %q uses %q, which no metric of the widget is", w.Properties.Title, e, ref)
				}
			}
		}
		for _, metric := range w.Properties.Metrics {
			if _, isExpr := metric[0].(map[string]any); isExpr {
				continue
			}
			ns, name := fmt.Sprint(metric[0]), fmt.Sprint(metric[1])
			dims := map[string]string{}
			for i := 2; i+1 < len(metric); i += 2 {
				k, ok := metric[i].(string)
				if !ok {
					break
				}
				dims[k] = fmt.Sprint(metric[i+1])
			}
			checkMetric(t, "widget "+w.Properties.Title, ns, name, dims, emitted, tplRes)
		}
	}
	if len(dash.Widgets) < 6 {
		t.Errorf("%d widgets, want the six the operations guide describes", len(dash.Widgets))
	}
	// Each widget the operations guide points an alarm at exists.
	guide, err := os.ReadFile(filepath.Join(root, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range regexp.MustCompile(`widget \*([^*]+)\*`).FindAllStringSubmatch(string(guide), -1) {
		if !titles[ref[1]] {
			t.Errorf("docs/operations.md points at widget %q, which the dashboard does not have", ref[1])
		}
	}

	// And every alarm's metric is real the same way.
	for id, r := range res {
		if m(r)["Type"] != "AWS::CloudWatch::Alarm" {
			continue
		}
		for _, metric := range alarmMetrics(m(m(r)["Properties"])) {
			dims := map[string]string{}
			ds, _ := metric["Dimensions"].([]any)
			for _, d := range ds {
				v := m(d)["Value"]
				switch {
				case m(v)["Ref"] != nil:
					dims[fmt.Sprint(m(d)["Name"])] = fmt.Sprint(m(v)["Ref"])
				case m(v)["Fn::GetAtt"] != nil:
					dims[fmt.Sprint(m(d)["Name"])] = getAtt(v)
				case len(subRefs(v)) > 0:
					dims[fmt.Sprint(m(d)["Name"])] = subRefs(v)[0]
				default:
					dims[fmt.Sprint(m(d)["Name"])] = fmt.Sprint(v)
				}
			}
			checkMetric(t, "alarm "+id, fmt.Sprint(metric["Namespace"]), fmt.Sprint(metric["MetricName"]), dims, emitted, tplRes)
		}
	}
}

func checkMetric(t *testing.T, where, ns, name string, dims map[string]string, emitted map[string]bool, tplRes map[string]string) {
	t.Helper()
	if ns == "holdfast" {
		if !emitted[name] {
			t.Errorf("%s: holdfast metric %s is never emitted by the code", where, name)
		}
		if dims["Stage"] != "Stage" || dims["Function"] == "" {
			t.Errorf("%s: holdfast metric %s by %v, want Function and this Stage", where, name, dims)
		}
		if fns, ok := emittedBy[name]; !ok || !slices.Contains(fns, dims["Function"]) {
			t.Errorf("%s: holdfast metric %s by Function=%s, but it is emitted by %v", where, name, dims["Function"], fns)
		}
		return
	}
	known, ok := awsMetrics[ns]
	if !ok {
		t.Errorf("%s: namespace %s is neither holdfast nor one the tests know AWS publishes", where, ns)
		return
	}
	found := false
	for _, n := range known.names {
		found = found || n == name
	}
	if !found {
		t.Errorf("%s: %s has no metric %s that the tests know of", where, ns, name)
	}
	for k, v := range dims {
		typ, ok := known.dims[k]
		switch {
		case !ok:
			t.Errorf("%s: %s %s has no dimension %s", where, ns, name, k)
		case typ != "" && tplRes[v] != typ:
			t.Errorf("%s: dimension %s=%s is not a %s of the template (%q)", where, k, v, typ, tplRes[v])
		}
	}
}

// rawResources maps each logical id of template.yaml to its type.
func rawResources(t *testing.T) map[string]string {
	t.Helper()
	tpl := loadTemplate(t)
	out := map[string]string{}
	for id, r := range m(tpl["Resources"]) {
		out[id] = fmt.Sprint(m(r)["Type"])
	}
	return out
}

func loadTemplate(t *testing.T) map[string]any {
	t.Helper()
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return tpl.Doc
}
