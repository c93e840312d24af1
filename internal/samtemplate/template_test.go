package samtemplate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/config"
)

const root = "../.."

// tool returns the path of a preinstalled checker, failing under make test
// (HOLDFAST_REQUIRE_SERVICES=1) and skipping elsewhere when it is missing.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%s is required to check template.yaml but is not installed (it ships with the image; see README)", name)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

func TestCfnLintPasses(t *testing.T) {
	lint := tool(t, "cfn-lint")
	// Informational findings too: each is decided in the template (e.g. an
	// explicit DeletionPolicy on every stateful resource).
	out, err := exec.Command(lint, "--include-checks", "I", "--", filepath.Join(root, "template.yaml")).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("cfn-lint --include-checks I template.yaml: %v\n%s", err, out)
	}
}

// translated is template.yaml after the SAM transform: plain CloudFormation.
func translated(t *testing.T) map[string]any {
	t.Helper()
	py := tool(t, "python3")
	cmd := exec.Command(py, filepath.Join(root, "scripts/sam-translate.py"), filepath.Join(root, "template.yaml"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sam-translate: %v\n%s", err, stderr.String())
	}
	var doc map[string]any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("translated template is not JSON: %v", err)
	}
	return doc
}

func m(v any) map[string]any { x, _ := v.(map[string]any); return x }

func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case string:
		var f float64
		_, _ = fmt.Sscan(x, &f)
		return f
	}
	return -1
}

// getAtt returns the logical id an {"Fn::GetAtt": [id, attr]} points at.
func getAtt(v any) string {
	if ga, ok := m(v)["Fn::GetAtt"].([]any); ok && len(ga) == 2 {
		s, _ := ga[0].(string)
		return s
	}
	return ""
}

func TestTranslatedWiring(t *testing.T) {
	doc := translated(t)
	res := m(doc["Resources"])
	props := func(id string) map[string]any {
		r := m(res[id])
		if r == nil {
			t.Fatalf("resource %s missing from the translated template", id)
		}
		return m(r["Properties"])
	}
	fnOf := func(v any) string {
		if ref, ok := m(v)["Ref"].(string); ok {
			return ref
		}
		return ""
	}

	// Each SQS event source: its queue, partial batch responses, a cap on concurrency.
	for esm, want := range map[string]struct{ fn, queue string }{
		"PersistFunctionReservations":   {"PersistFunction", "ReservationQueue"},
		"CompensateFunctionDeadLetters": {"CompensateFunction", "ReservationDLQ"},
	} {
		p := props(esm)
		if fnOf(p["FunctionName"]) != want.fn || getAtt(p["EventSourceArn"]) != want.queue {
			t.Errorf("%s: function %v source %v, want %s on %s", esm, p["FunctionName"], p["EventSourceArn"], want.fn, want.queue)
		}
		if frt, _ := p["FunctionResponseTypes"].([]any); len(frt) != 1 || frt[0] != "ReportBatchItemFailures" {
			t.Errorf("%s: FunctionResponseTypes = %v, want [ReportBatchItemFailures]", esm, p["FunctionResponseTypes"])
		}
		if c := num(m(p["ScalingConfig"])["MaximumConcurrency"]); c < 2 || c > 1000 {
			t.Errorf("%s: MaximumConcurrency = %v, want 2-1000", esm, c)
		}
	}

	// Redrive to the DLQ; visibility ≥ 6 × persist timeout; DLQ keeps messages longer.
	q, dlq := props("ReservationQueue"), props("ReservationDLQ")
	rp := m(q["RedrivePolicy"])
	if getAtt(rp["deadLetterTargetArn"]) != "ReservationDLQ" || num(rp["maxReceiveCount"]) < 5 {
		t.Errorf("RedrivePolicy = %v, want ReservationDLQ with maxReceiveCount ≥ 5", rp)
	}
	if vt, to := num(q["VisibilityTimeout"]), num(props("PersistFunction")["Timeout"]); vt < 6*to {
		t.Errorf("queue visibility %v < 6 × persist timeout %v", vt, to)
	}
	if getAtt(m(dlq["RedrivePolicy"])["deadLetterTargetArn"]) != "ReservationParking" {
		t.Errorf("the DLQ redrives to %v, want the parking queue (what compensate cannot settle must not expire silently)", dlq["RedrivePolicy"])
	}
	if age := num(props("QueueAgeAlarm")["Threshold"]); age <= 2*num(q["VisibilityTimeout"]) {
		t.Errorf("queue age alarm at %v s fires on one record failing twice (visibility %v s)", age, q["VisibilityTimeout"])
	}
	if num(dlq["MessageRetentionPeriod"]) <= num(q["MessageRetentionPeriod"]) {
		t.Errorf("DLQ retention %v must exceed the queue's %v", dlq["MessageRetentionPeriod"], q["MessageRetentionPeriod"])
	}

	// The sweeper: a schedule every minute targeting it, named per stage;
	// reserved concurrency only when asked (low-quota accounts cannot
	// reserve any); no async retries of a failed tick.
	sched := props("SweeperFunctionEveryMinute")
	if sched["ScheduleExpression"] != "rate(1 minute)" || getAtt(m(sched["Target"])["Arn"]) != "SweeperFunction" {
		t.Errorf("sweeper schedule = %v", sched)
	}
	if name := fmt.Sprint(m(sched["Name"])["Fn::Sub"]); !strings.Contains(name, "${Stage}") {
		t.Errorf("schedule name %v must name the stage (two stages in one account clash otherwise)", sched["Name"])
	}
	if rc, ok := m(props("SweeperFunction")["ReservedConcurrentExecutions"])["Fn::If"].([]any); !ok || rc[0] != "ReserveSweeper" {
		t.Errorf("SweeperFunction reserved concurrency = %v, want it behind the ReserveSweeper condition", props("SweeperFunction")["ReservedConcurrentExecutions"])
	}
	eic := props("SweeperFunctionEventInvokeConfig")
	if num(eic["MaximumRetryAttempts"]) != 0 || num(eic["MaximumEventAgeInSeconds"]) != 60 {
		t.Errorf("sweeper EventInvokeConfig = %v, want 0 retries within 60 s", eic)
	}

	// Every alarm's dimensions point at something that exists.
	functions := map[string]bool{"reserve": true, "persist": true, "compensate": true, "sweeper": true}
	alarms := 0
	listed := map[string]bool{}
	if join, _ := m(m(m(doc["Outputs"])["AlarmNames"])["Value"])["Fn::Join"].([]any); len(join) == 2 {
		items, _ := join[1].([]any)
		for _, it := range items {
			listed[fmt.Sprint(m(it)["Ref"])] = true
			if cond, _ := m(it)["Fn::If"].([]any); len(cond) == 3 { // an alarm of a conditional resource
				listed[fmt.Sprint(m(cond[1])["Ref"])] = true
			}
		}
	}
	for id, r := range res {
		if m(r)["Type"] != "AWS::CloudWatch::Alarm" {
			continue
		}
		alarms++
		p := m(m(r)["Properties"])
		if p["TreatMissingData"] == nil {
			t.Errorf("%s: TreatMissingData not chosen", id)
		}
		if p["Namespace"] == "holdfast" {
			dims, _ := json.Marshal(p["Dimensions"])
			if !strings.Contains(string(dims), `{"Name":"Stage","Value":{"Ref":"Stage"}}`) {
				t.Errorf("%s: a holdfast metric without the Stage dimension mixes every stage of the account", id)
			}
		}
		if !listed[id] {
			t.Errorf("%s is missing from the AlarmNames output", id)
		}
		if acts, _ := p["AlarmActions"].([]any); len(acts) == 0 || m(acts[0])["Fn::If"] == nil {
			t.Errorf("%s: AlarmActions = %v, want the given topic or the stack's own (no alarm without an action)", id, p["AlarmActions"])
		}
		// Operators hear when it clears, on the same topic.
		if a, o := fmt.Sprint(p["AlarmActions"]), fmt.Sprint(p["OKActions"]); a != o {
			t.Errorf("%s: OKActions = %s, want the AlarmActions' topic %s (nobody hears the alarm clear)", id, o, a)
		}
		for _, d := range alarmDimensions(p) {
			dim := m(d)
			v := dim["Value"]
			switch {
			case len(subRefs(v)) > 0:
				for _, ref := range subRefs(v) {
					if res[ref] == nil {
						t.Errorf("%s: dimension %v refers to a missing resource %s", id, dim, ref)
					}
				}
			case fnOf(v) != "":
				if res[fnOf(v)] == nil && m(doc["Parameters"])[fnOf(v)] == nil {
					t.Errorf("%s: dimension %v refers to a missing resource", id, dim)
				}
			case getAtt(v) != "":
				if res[getAtt(v)] == nil {
					t.Errorf("%s: dimension %v refers to a missing resource", id, dim)
				}
			case dim["Name"] == "Function":
				if !functions[fmt.Sprint(v)] {
					t.Errorf("%s: Function dimension %v is not a function the code names", id, v)
				}
			case dim["Name"] == "Stage":
			default:
				t.Errorf("%s: dimension %v points at nothing known", id, dim)
			}
		}
	}
	if alarms < 8 {
		t.Errorf("alarms = %d, want the 8+ the operations guide describes", alarms)
	}
}

func TestEveryVariableMatchesTheCode(t *testing.T) {
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, k := range config.Keys() {
		known[k] = true
	}
	fns := tpl.Functions()
	if len(fns) != 5 {
		t.Fatalf("functions = %d, want 5", len(fns))
	}
	required := []string{"HOLDFAST_REDIS_ADDR", "HOLDFAST_DB_HOST", "HOLDFAST_DB_SECRET_ID", "HOLDFAST_EVENT_BUS"}
	for id, f := range fns {
		for _, name := range f.EnvNames() {
			if !known[name] {
				t.Errorf("%s sets %s, which the code never reads", id, name)
			}
		}
		need := required
		switch id {
		case "ReserveFunction":
			need = append(slices.Clone(required), "HOLDFAST_QUEUE_URL")
		case "MigrateFunction":
			need = []string{"HOLDFAST_DB_HOST", "HOLDFAST_DB_SECRET_ID", "HOLDFAST_DB_ADMIN_SECRET_ID"}
		}
		for _, name := range need {
			if _, ok := f.Env[name]; !ok {
				t.Errorf("%s lacks %s", id, name)
			}
		}
	}
}

// The HTTP API is api/openapi.yaml, included (sam deploy uploads it), and
// API Gateway may invoke the reserve function for it.
func TestTheAPIIsTheOpenAPIDocument(t *testing.T) {
	doc := translated(t)
	res := m(doc["Resources"])
	body := m(m(res["HttpApi"])["Properties"])["Body"]
	tr := m(m(body)["Fn::Transform"])
	if tr["Name"] != "AWS::Include" || m(tr["Parameters"])["Location"] != "api/openapi.yaml" {
		t.Fatalf("HttpApi body = %v, want the AWS::Include of api/openapi.yaml", body)
	}
	perm := m(m(res["ReserveApiPermission"])["Properties"])
	if perm["Principal"] != "apigateway.amazonaws.com" || m(perm["FunctionName"])["Ref"] != "ReserveFunction" ||
		!strings.Contains(fmt.Sprint(m(perm["SourceArn"])["Fn::Sub"]), "${HttpApi}/") {
		t.Errorf("ReserveApiPermission = %v, want API Gateway invoking ReserveFunction for this API only", perm)
	}
	for id, r := range res {
		if m(r)["Type"] == "AWS::Lambda::Permission" && id != "ReserveApiPermission" && id != "MigrateFunctionPermission" {
			t.Errorf("%s: a second way to invoke a function (routes belong to api/openapi.yaml)", id)
		}
	}
	// Every parameter and condition the document refers to exists.
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(m(m(tpl.Doc["Resources"])["HttpApi"])["Properties"])
	for _, ref := range regexp.MustCompile(`"(?:Ref|Fn::If)":\[?"([A-Za-z]+)"`).FindAllStringSubmatch(string(raw), -1) {
		name := ref[1]
		if m(doc["Parameters"])[name] == nil && m(doc["Conditions"])[name] == nil && !strings.HasPrefix(name, "AWS") {
			t.Errorf("api/openapi.yaml refers to %s, which template.yaml does not declare", name)
		}
	}
	for _, sub := range regexp.MustCompile(`\$\{(\w+)\.Arn\}`).FindAllStringSubmatch(string(raw), -1) {
		if res[sub[1]] == nil && m(doc["Resources"])[sub[1]+"Role"] == nil {
			t.Errorf("api/openapi.yaml integrates %s, which template.yaml does not declare", sub[1])
		}
	}
}

// Rules a first deploy depends on, checked mechanically: every function's
// log group is the stack's, with a retention; no fixed physical name (a
// second stage in the account would clash); the DLQ is a redrive target.
func TestDeployRules(t *testing.T) {
	doc := translated(t)
	res := m(doc["Resources"])
	logGroups := map[string]bool{}
	for id, r := range res {
		if m(r)["Type"] != "AWS::Logs::LogGroup" {
			continue
		}
		p := m(m(r)["Properties"])
		if p["RetentionInDays"] == nil {
			t.Errorf("%s: no RetentionInDays", id)
		}
		logGroups[fmt.Sprint(m(p["LogGroupName"])["Fn::Sub"])] = true
	}
	nameKeys := []string{"FunctionName", "QueueName", "AlarmName", "TopicName", "Name", "LogGroupName", "ReplicationGroupId", "DBClusterIdentifier", "DBProxyName"}
	functions := 0
	for id, r := range res {
		p := m(m(r)["Properties"])
		if m(r)["Type"] == "AWS::Lambda::Function" {
			functions++
			name := fmt.Sprint(m(p["FunctionName"])["Fn::Sub"])
			if !logGroups["/aws/lambda/"+name] {
				t.Errorf("%s (%s): no log group of the stack's with a retention", id, name)
			}
		}
		if m(r)["Type"] == "AWS::Lambda::Alias" {
			continue // an alias's name is the function's own, not the account's
		}
		for _, k := range nameKeys {
			v, ok := p[k]
			if !ok {
				continue
			}
			if s, isString := v.(string); isString {
				t.Errorf("%s: %s %q is fixed: two stages in one account would clash", id, k, s)
			}
		}
	}
	if functions != 5 {
		t.Errorf("checked %d functions, want 5", functions)
	}

	// The schema: the custom resource carries the newest migration (so a
	// release that adds one makes CloudFormation run it), answers within
	// bounded time, and every function that serves waits for it.
	schema := m(res["Schema"])
	sp := m(schema["Properties"])
	if getAtt(sp["ServiceToken"]) != "MigrateFunction" {
		t.Errorf("Schema's ServiceToken = %v, want the migrate function", sp["ServiceToken"])
	}
	if v := int(num(sp["SchemaVersion"])); v != mysqlstore.Latest() {
		t.Errorf("Schema's SchemaVersion = %d, but the newest migration is %d: a deploy would not run it", v, mysqlstore.Latest())
	}
	migrateTimeout := num(m(m(res["MigrateFunction"])["Properties"])["Timeout"])
	if st := num(sp["ServiceTimeout"]); st <= migrateTimeout || st > 3600 {
		t.Errorf("Schema's ServiceTimeout = %v, want above the migrate function's timeout %v and at most 3600", st, migrateTimeout)
	}
	for _, fn := range []string{"ReserveFunction", "PersistFunction", "CompensateFunction", "SweeperFunction"} {
		deps, _ := m(res[fn])["DependsOn"].([]any)
		if dep, ok := m(res[fn])["DependsOn"].(string); ok {
			deps = append(deps, dep)
		}
		if !slices.Contains(deps, any("Schema")) {
			t.Errorf("%s does not depend on Schema: new code could run before its migrations", fn)
		}
	}

	// Schema names the migrate function's code version (a release with new
	// migrations or privileges runs it) and the network it needs.
	if !strings.HasPrefix(fmt.Sprint(m(sp["CodeVersion"])["Ref"]), "MigrateFunctionVersion") {
		t.Errorf("Schema's CodeVersion = %v, want the migrate function's published version", sp["CodeVersion"])
	}
	netw, _ := json.Marshal(sp["Network"])
	for _, dep := range []string{"SecretsEndpoint", "S3Endpoint", "ExistingEndpointIngress"} {
		if !strings.Contains(string(netw), `"Ref":"`+dep+`"`) {
			t.Errorf("Schema does not refer to %s: CloudFormation may run it before the network it needs exists, or delete it first", dep)
		}
	}
	// The account the migrate function manages is the one the secret names.
	tplDoc, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	appUser := fmt.Sprint(m(tplDoc.Functions()["MigrateFunction"].Env["HOLDFAST_DB_APP_USER"])["Fn::Sub"])
	secretTpl := fmt.Sprint(m(m(m(m(tplDoc.Doc["Resources"])["DbAppSecret"])["Properties"])["GenerateSecretString"])["SecretStringTemplate"])
	if appUser == "" || !strings.Contains(secretTpl, `"username":"`+appUser+`"`) {
		t.Errorf("the migrate function manages %q, the secret names %s", appUser, secretTpl)
	}
	// Secrets are kept, except when the deploy that created them rolls back
	// (a failed first deploy can be retried under the same names).
	for id, r := range res {
		if m(r)["Type"] == "AWS::SecretsManager::Secret" && (m(r)["DeletionPolicy"] != "RetainExceptOnCreate" || m(r)["UpdateReplacePolicy"] != "Retain") {
			t.Errorf("%s: DeletionPolicy %v / UpdateReplacePolicy %v, want RetainExceptOnCreate / Retain", id, m(r)["DeletionPolicy"], m(r)["UpdateReplacePolicy"])
		}
	}

	// Least privilege in MySQL: the functions read their own user's secret;
	// only the migrate function (and the proxy) may read the master's.
	for id, r := range res {
		if m(r)["Type"] != "AWS::IAM::Role" && m(r)["Type"] != "AWS::IAM::ManagedPolicy" {
			continue
		}
		b, _ := json.Marshal(m(r)["Properties"])
		if strings.Contains(string(b), `{"Ref":"DbSecret"}`) && id != "MigrateFunctionRole" && id != "DbProxyRole" {
			t.Errorf("%s can read the master user's secret", id)
		}
	}

	// Aurora on a long-term-support release, kept there.
	if v := fmt.Sprint(m(m(res["DbCluster"])["Properties"])["EngineVersion"]); !regexp.MustCompile(`^8\.0\.mysql_aurora\.3\.(04|10)\.\d+$`).MatchString(v) {
		t.Errorf("Aurora engine %s is not a long-term-support release (3.04.*, 3.10.*)", v)
	}
	for _, id := range []string{"DbWriter", "DbReader"} {
		if auto := m(m(res[id])["Properties"])["AutoMinorVersionUpgrade"]; auto != false {
			t.Errorf("%s: AutoMinorVersionUpgrade = %v, want false (an automatic upgrade may leave the LTS line)", id, auto)
		}
	}

	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for id, f := range tpl.Functions() {
		if v, ok := f.Env["HOLDFAST_DB_TLS"]; ok && v != "verify" {
			t.Errorf("%s sets HOLDFAST_DB_TLS=%v: the DSN must require verified TLS in AWS", id, v)
		}
		if b, _ := json.Marshal(f.Env["HOLDFAST_DB_SECRET_ID"]); string(b) != `{"Ref":"DbAppSecret"}` {
			t.Errorf("%s logs in with %s, want the functions' own user (DbAppSecret)", id, b)
		}
	}
}

// samconfig.toml: sam deploy's defaults per stage, with the capabilities the
// template needs, and overrides only of parameters the template declares.
func TestSamconfigDeploysTheTemplate(t *testing.T) {
	py := tool(t, "python3")
	out, err := exec.Command(py, "-c", `import json,sys,tomllib; print(json.dumps(tomllib.load(open(sys.argv[1],"rb"))))`,
		filepath.Join(root, "samconfig.toml")).Output()
	if err != nil {
		t.Fatalf("samconfig.toml is not TOML: %v", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	params := m(translated(t)["Parameters"])
	override := regexp.MustCompile(`(\w+)="([^"]*)"`)
	for _, env := range []string{"default", "prod"} {
		deploy := m(m(cfg[env])["deploy"])["parameters"]
		d := m(deploy)
		stack := fmt.Sprint(m(m(m(cfg[env])["global"])["parameters"])["stack_name"])
		if !strings.HasPrefix(stack, "holdfast-") {
			t.Errorf("[%s] stack_name = %q", env, stack)
		}
		if caps := fmt.Sprint(d["capabilities"]); !strings.Contains(caps, "CAPABILITY_IAM") {
			t.Errorf("[%s] capabilities = %q: the template creates IAM roles", env, caps)
		}
		if b := m(m(m(cfg[env])["build"])["parameters"]); b["build_in_source"] != true {
			t.Errorf("[%s] build parameters = %v: want build_in_source, so that sam build copies nothing of the checkout (make dev's data lives in it)", env, b)
		}
		if d["resolve_s3"] != true || d["confirm_changeset"] != true {
			t.Errorf("[%s] want resolve_s3 (the code and api/openapi.yaml are uploaded) and a confirmed change set: %v", env, d)
		}
		var stage string
		for _, kv := range override.FindAllStringSubmatch(fmt.Sprint(d["parameter_overrides"]), -1) {
			if params[kv[1]] == nil {
				t.Errorf("[%s] overrides %s, which template.yaml does not declare", env, kv[1])
			}
			if kv[1] == "Stage" {
				stage = kv[2]
			}
		}
		if stack != "holdfast-"+stage {
			t.Errorf("[%s] stack %s deploys stage %q", env, stack, stage)
		}
	}
}

// alarmMetrics returns the metrics an alarm reads, each as {Namespace,
// MetricName, Dimensions}: the alarm's own, or those of its metric math.
func alarmMetrics(p map[string]any) []map[string]any {
	if ms, ok := p["Metrics"].([]any); ok {
		var out []map[string]any
		for _, q := range ms {
			if metric := m(m(m(q)["MetricStat"])["Metric"]); metric != nil {
				out = append(out, metric)
			}
		}
		return out
	}
	return []map[string]any{p}
}

func alarmDimensions(p map[string]any) []any {
	var out []any
	for _, metric := range alarmMetrics(p) {
		ds, _ := metric["Dimensions"].([]any)
		out = append(out, ds...)
	}
	return out
}

// subRefs returns the resources a dimension value built with Fn::Sub (or
// either branch of an Fn::If of them) names: ${Redis}-001 names Redis.
func subRefs(v any) []string {
	if cond, ok := m(v)["Fn::If"].([]any); ok && len(cond) == 3 {
		return append(subRefs(cond[1]), subRefs(cond[2])...)
	}
	sub, ok := m(v)["Fn::Sub"].(string)
	if !ok {
		return nil
	}
	var out []string
	for _, ref := range regexp.MustCompile(`\$\{([A-Za-z]+)\}`).FindAllStringSubmatch(sub, -1) {
		out = append(out, ref[1])
	}
	return out
}
