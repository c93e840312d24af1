package samtemplate_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestTemplateOperability holds what the deploy review of issue 21 asked
// of template.yaml, on the SAM-translated template: each subtest is one
// finding, stated as what holds now.
func TestTemplateOperability(t *testing.T) {
	doc := translated(t)
	res := m(doc["Resources"])
	props := func(id string) map[string]any {
		t.Helper()
		r := m(res[id])
		if r == nil {
			t.Fatalf("resource %s missing from the translated template", id)
		}
		return m(r["Properties"])
	}

	t.Run("the RDS Proxy is renamed when its subnets change", func(t *testing.T) {
		// VpcSubnetIds can only be set at creation: a replacement under the
		// same name fails. The name carries the id of a group whose
		// description (replace-only) names the subnets.
		p := props("DbProxy")
		name, _ := m(p["DBProxyName"])["Fn::Sub"].(string)
		if !strings.Contains(name, "${DbProxySecurityGroup}") || !strings.Contains(name, "${Stage}") {
			t.Fatalf("DBProxyName = %v, want one naming the stage and ${DbProxySecurityGroup}", p["DBProxyName"])
		}
		desc, _ := json.Marshal(props("DbProxySecurityGroup")["GroupDescription"])
		if !strings.Contains(string(desc), `{"Fn::Join":[",",{"Ref":"SubnetIds"}]}`) {
			t.Errorf("DbProxySecurityGroup's description %s does not name SubnetIds: it would not be replaced with them", desc)
		}
		if sgs, _ := json.Marshal(p["VpcSecurityGroupIds"]); string(sgs) != `[{"Ref":"DbProxySecurityGroup"}]` {
			t.Errorf("the proxy's groups are %s, want DbProxySecurityGroup", sgs)
		}
	})

	t.Run("each function is deleted before its log group", func(t *testing.T) {
		// A function that names its group by Ref depends on it: CloudFormation
		// deletes the function first, so nothing re-creates the group during a
		// teardown, and the next stack of the stage can create it.
		n := 0
		for id, r := range res {
			if m(r)["Type"] != "AWS::Lambda::Function" {
				continue
			}
			n++
			p := m(m(r)["Properties"])
			lg := fmt.Sprint(m(m(p["LoggingConfig"])["LogGroup"])["Ref"])
			if m(res[lg])["Type"] != "AWS::Logs::LogGroup" {
				t.Errorf("%s: LoggingConfig.LogGroup = %v, want a Ref to the stack's log group", id, m(p["LoggingConfig"])["LogGroup"])
				continue
			}
			want := "/aws/lambda/" + fmt.Sprint(m(p["FunctionName"])["Fn::Sub"])
			if got := fmt.Sprint(m(m(m(res[lg])["Properties"])["LogGroupName"])["Fn::Sub"]); got != want {
				t.Errorf("%s writes to %s named %s, want %s", id, lg, got, want)
			}
		}
		if n != 5 {
			t.Errorf("checked %d functions, want 5", n)
		}
	})

	t.Run("platform REPORT lines are kept", func(t *testing.T) {
		// REPORT (Duration, Max Memory Used, Init Duration) is an INFO system
		// log: at WARN Lambda drops it, and the runbook reads it.
		for id, r := range res {
			if m(r)["Type"] != "AWS::Lambda::Function" {
				continue
			}
			lvl := m(m(m(r)["Properties"])["LoggingConfig"])["SystemLogLevel"]
			if lvl != "INFO" && lvl != "DEBUG" {
				t.Errorf("%s: SystemLogLevel = %v, want INFO (REPORT lines are INFO)", id, lvl)
			}
		}
	})

	t.Run("the API stage writes JSON access logs", func(t *testing.T) {
		als := m(props("HttpApiStage")["AccessLogSettings"])
		lg := getAtt(als["DestinationArn"])
		if m(res[lg])["Type"] != "AWS::Logs::LogGroup" || m(m(res[lg])["Properties"])["RetentionInDays"] == nil {
			t.Fatalf("access logs go to %v, want a log group of the stack's with a retention", als["DestinationArn"])
		}
		var format map[string]string
		if err := json.Unmarshal([]byte(fmt.Sprint(als["Format"])), &format); err != nil {
			t.Fatalf("access log format %q is not JSON: %v", als["Format"], err)
		}
		for _, k := range []string{"requestId", "routeKey", "status", "integrationLatency", "integrationError"} {
			if !strings.HasPrefix(format[k], "$context.") {
				t.Errorf("access log field %s = %q, want a $context variable", k, format[k])
			}
		}
	})

	t.Run("a Redis running out of memory alarms", func(t *testing.T) {
		found := false
		for id, r := range res {
			if m(r)["Type"] != "AWS::CloudWatch::Alarm" {
				continue
			}
			memory := false
			for _, metric := range alarmMetrics(m(m(r)["Properties"])) {
				memory = memory || metric["Namespace"] == "AWS/ElastiCache" && metric["MetricName"] == "DatabaseMemoryUsagePercentage"
			}
			if memory {
				found = true
				if m(r)["Condition"] != "CreateData" {
					t.Errorf("%s: Condition %v, want CreateData (the stack's own Redis)", id, m(r)["Condition"])
				}
				for _, d := range alarmDimensions(m(m(r)["Properties"])) {
					if refs := subRefs(m(d)["Value"]); !slices.Equal(refs, []string{"Redis", "Redis"}) {
						t.Errorf("%s: node %v, want one of the Redis replication group's nodes in either mode", id, m(d)["Value"])
					}
				}
			}
			if p := m(m(r)["Properties"]); memory && num(p["Threshold"]) >= 100 {
				t.Errorf("%s: threshold %v%% fires only when Redis already refuses writes", id, p["Threshold"])
			}
		}
		if !found {
			t.Error("no alarm reads ElastiCache's DatabaseMemoryUsagePercentage: with noeviction a full Redis refuses every reservation")
		}
	})

	t.Run("persist and compensate receive and delete only on their own queues", func(t *testing.T) {
		// SAM's SQS event attaches AWSLambdaSQSQueueExecutionRole (every
		// queue); an explicit Deny on every other queue scopes it.
		for fn, queue := range map[string]string{"PersistFunction": "ReservationQueue", "CompensateFunction": "ReservationDLQ"} {
			role := props(fn + "Role")
			managed, _ := json.Marshal(role["ManagedPolicyArns"])
			if !strings.Contains(string(managed), "AWSLambdaSQSQueueExecutionRole") {
				continue // nothing grants on every queue
			}
			denied := map[string]bool{}
			for _, pol := range role["Policies"].([]any) {
				for _, st := range m(m(pol)["PolicyDocument"])["Statement"].([]any) {
					s := m(st)
					if s["Effect"] != "Deny" || getAtt(s["NotResource"]) != queue {
						continue
					}
					acts, _ := s["Action"].([]any)
					for _, a := range acts {
						denied[fmt.Sprint(a)] = true
					}
				}
			}
			for _, a := range []string{"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:DeleteMessageBatch", "sqs:ChangeMessageVisibility"} {
				if !denied[a] {
					t.Errorf("%s may %s on every queue (AWSLambdaSQSQueueExecutionRole), not only %s", fn, a, queue)
				}
			}
		}
	})

	t.Run("interface endpoints take their own subnets, one per AZ", func(t *testing.T) {
		param := m(m(doc["Parameters"])["EndpointSubnetIds"])
		if !strings.Contains(fmt.Sprint(param["Description"]), "one per") {
			t.Errorf("EndpointSubnetIds = %v, want a parameter that says one subnet per Availability Zone", param)
		}
		for id, r := range res {
			p := m(m(r)["Properties"])
			if m(r)["Type"] != "AWS::EC2::VPCEndpoint" || p["VpcEndpointType"] != "Interface" {
				continue
			}
			if b, _ := json.Marshal(p["SubnetIds"]); string(b) != `{"Fn::If":["HasEndpointSubnets",{"Ref":"EndpointSubnetIds"},{"Ref":"SubnetIds"}]}` {
				t.Errorf("%s: SubnetIds = %s, want EndpointSubnetIds when given", id, b)
			}
		}
	})
}
