package samtemplate_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
)

// The dev gateway authorizes from Routes: every served route must be there,
// buyer routes behind the JWT authorizer, /admin behind IAM.
func TestRoutesCarryTheirAuthorizers(t *testing.T) {
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range tpl.Routes() {
		keys = append(keys, r.Key()) // API Gateway's routeKey, which the handler dispatches on
		want := samtemplate.Route{Function: "ReserveFunction", Method: r.Method, Path: r.Path,
			Authorizer: "BuyerJwt", AuthType: "JWT", IdentityHeader: "Authorization"}
		if strings.HasPrefix(r.Path, "/admin/") {
			want.Authorizer, want.AuthType, want.IdentityHeader = "AWS_IAM", "AWS_IAM", ""
		}
		if r != want {
			t.Errorf("route %s = %+v, want %+v", r.Key(), r, want)
		}
	}
	served := httpapi.Routes()
	slices.Sort(keys)
	slices.Sort(served)
	if !slices.Equal(keys, served) {
		t.Errorf("template routes %v, served %v", keys, served)
	}
}

// The order service's policy lets it invoke exactly the routes it pays or
// releases by, POST on this API's stage, and nothing else of the API (a
// stock change, a report): least privilege, held to the document's routes.
func TestOrderServicePolicyGrantsItsRoutesOnly(t *testing.T) {
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res, _ := tpl.Doc["Resources"].(map[string]any)
	policy, _ := res["OrderServiceApiPolicy"].(map[string]any)
	props, _ := policy["Properties"].(map[string]any)
	doc, _ := props["PolicyDocument"].(map[string]any)
	statements, _ := doc["Statement"].([]any)
	if policy["Type"] != "AWS::IAM::ManagedPolicy" || len(statements) != 1 {
		t.Fatalf("OrderServiceApiPolicy = %v, want a managed policy of one statement", policy)
	}
	st, _ := statements[0].(map[string]any)
	if st["Effect"] != "Allow" || st["Action"] != "execute-api:Invoke" {
		t.Errorf("statement = %v, want Allow execute-api:Invoke", st)
	}
	const prefix = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${HttpApi}/${Stage}/"
	var granted []string
	resources, _ := st["Resource"].([]any)
	for _, r := range resources {
		sub, _ := r.(map[string]any)
		arn, _ := sub["Fn::Sub"].(string)
		rest, ok := strings.CutPrefix(arn, prefix)
		method, path, _ := strings.Cut(rest, "/")
		if !ok || strings.Contains(method, "*") {
			t.Errorf("resource %q: want one method and path of this API's stage (%s<METHOD>/<path>)", arn, prefix)
			continue
		}
		granted = append(granted, method+" /"+path)
	}
	// Each granted pattern names the routes it lets the caller invoke, as
	// IAM matches it: a * is any text, slashes included.
	var reached []string
	for _, g := range granted {
		method, pattern, _ := strings.Cut(g, " ")
		re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(pattern), `\*`, ".*") + "$")
		for _, r := range tpl.Routes() {
			if r.Method == method && re.MatchString(param.ReplaceAllString(r.Path, "p")) {
				reached = append(reached, r.Key())
			}
		}
	}
	slices.Sort(reached)
	want := []string{"POST /admin/reservations/{id}/cancel", "POST /admin/reservations/{id}/paid"}
	if !slices.Equal(reached, want) {
		t.Errorf("the order service may invoke %v (granted %v), want exactly %v", reached, granted, want)
	}
}

// param is a path parameter of a route ("{id}").
var param = regexp.MustCompile(`\{[^}]+\}`)

// make dev's dev sign-in (POST /dev/token, a token for anyone who asks) and
// its buyer page never ship: neither template.yaml nor api/openapi.yaml has
// a route or a path under /dev or /shop, and no function's code names the
// sign-in. In AWS the page comes from S3 and tokens from the real identity
// provider (docs/operations.md, "The buyer page").
func TestDevSignInIsNotDeployed(t *testing.T) {
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range tpl.Routes() {
		if p := r.Path + "/"; strings.HasPrefix(p, "/dev/") || strings.HasPrefix(p, "/shop/") {
			t.Errorf("route %s is a dev page's: it must not be deployed", r.Key())
		}
	}
	files := []string{filepath.Join(root, "template.yaml"), filepath.Join(root, "api", "openapi.yaml")}
	for _, dir := range []string{"functions", "shared"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"/dev/token", "/dev/{"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s names %q: the dev sign-in must not ship", f, bad)
			}
		}
	}
}
