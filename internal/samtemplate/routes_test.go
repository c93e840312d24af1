package samtemplate_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
)

// The dev gateway authorizes from Routes: every served route must be there,
// buyer routes behind the JWT authorizer, /admin behind IAM, and one route
// public: the waiting room's status, the same answer for everyone.
func TestRoutesCarryTheirAuthorizers(t *testing.T) {
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	reserve := time.Duration(tpl.Functions()["ReserveFunction"].Timeout) * time.Second
	for _, r := range tpl.Routes() {
		keys = append(keys, r.Key()) // API Gateway's routeKey, which the handler dispatches on
		want := samtemplate.Route{Function: "ReserveFunction", Method: r.Method, Path: r.Path,
			Authorizer: "BuyerJwt", AuthType: "JWT", IdentityHeader: "Authorization", Timeout: reserve}
		switch {
		case strings.HasPrefix(r.Path, "/admin/"):
			want.Authorizer, want.AuthType, want.IdentityHeader = "AWS_IAM", "AWS_IAM", ""
		case r.Key() == "GET /skus/{sku}/queue": // the waiting room's public status
			want.Authorizer, want.AuthType, want.IdentityHeader = "NONE", "NONE", ""
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

// The CloudFront distribution caches the waiting room's public status and
// nothing else: one cache behaviour, whose path pattern reaches no GET route
// but the public one, keeps it 1 s keyed by the path alone; every other path
// goes to the API uncached with the viewer's headers (the buyer's JWT) but
// Host. The origin is this API's stage.
func TestTheCDNCachesThePublicStatusOnly(t *testing.T) {
	tpl, err := samtemplate.Load(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res, _ := tpl.Doc["Resources"].(map[string]any)
	get := func(v any, keys ...string) any {
		for _, k := range keys {
			m, _ := v.(map[string]any)
			v = m[k]
		}
		return v
	}
	const cachingDisabled, allViewerExceptHost = "4135ea2d-6df8-44a3-9df3-4b5a84be39ad", "b689b0a8-53d0-40ab-baf2-68738e2966ac"
	cfg := get(res["ApiCdn"], "Properties", "DistributionConfig")
	if get(res["ApiCdn"], "Type") != "AWS::CloudFront::Distribution" || cfg == nil {
		t.Fatalf("ApiCdn = %v, want a CloudFront distribution", res["ApiCdn"])
	}
	origins, _ := get(cfg, "Origins").([]any)
	if len(origins) != 1 || get(origins[0], "DomainName", "Fn::Sub") != "${HttpApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}" ||
		get(origins[0], "OriginPath", "Fn::Sub") != "/${Stage}" || get(origins[0], "CustomOriginConfig", "OriginProtocolPolicy") != "https-only" {
		t.Errorf("origins = %v, want this HTTP API's stage, over HTTPS only", origins)
	}
	def := get(cfg, "DefaultCacheBehavior")
	if get(def, "CachePolicyId") != cachingDisabled || get(def, "OriginRequestPolicyId") != allViewerExceptHost {
		t.Errorf("default behaviour = %v, want CachingDisabled with AllViewerExceptHostHeader", def)
	}
	behaviours, _ := get(cfg, "CacheBehaviors").([]any)
	if len(behaviours) != 1 {
		t.Fatalf("cache behaviours = %v, want one (the public status)", behaviours)
	}
	b := behaviours[0]
	if ref := get(b, "CachePolicyId", "Ref"); ref != "QueueStatusCachePolicy" {
		t.Fatalf("the status behaviour's cache policy = %v, want QueueStatusCachePolicy", get(b, "CachePolicyId"))
	}
	policy := get(res["QueueStatusCachePolicy"], "Properties", "CachePolicyConfig")
	for _, ttl := range []string{"MinTTL", "DefaultTTL", "MaxTTL"} {
		if v := get(policy, ttl); fmt.Sprint(v) != "1" {
			t.Errorf("QueueStatusCachePolicy %s = %v, want 1 (second)", ttl, v)
		}
	}
	key := get(policy, "ParametersInCacheKeyAndForwardedToOrigin")
	if get(key, "CookiesConfig", "CookieBehavior") != "none" || get(key, "HeadersConfig", "HeaderBehavior") != "none" ||
		get(key, "QueryStringsConfig", "QueryStringBehavior") != "none" {
		t.Errorf("the status's cache key = %v, want the path alone (no cookie, header or query string)", key)
	}
	// CloudFront's * is any text, slashes included.
	pattern, _ := get(b, "PathPattern").(string)
	re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(pattern), `\*`, ".*") + "$")
	var cached []string
	for _, r := range tpl.Routes() {
		if r.Method == "GET" && re.MatchString(param.ReplaceAllString(r.Path, "p")) {
			cached = append(cached, r.Key())
			if r.AuthType != "NONE" {
				t.Errorf("the distribution caches %s, which has the %s authorizer: one buyer's answer would be served to others", r.Key(), r.AuthType)
			}
		}
	}
	if !slices.Equal(cached, []string{"GET /skus/{sku}/queue"}) {
		t.Errorf("the distribution caches %v (pattern %q), want exactly GET /skus/{sku}/queue", cached, pattern)
	}
	methods, _ := get(b, "AllowedMethods").([]any)
	if !slices.Contains(methods, any("POST")) || get(b, "OriginRequestPolicyId") != allViewerExceptHost {
		t.Errorf("the status behaviour = %v, want POST (joining) allowed through, with the viewer's headers", b)
	}
	outputs, _ := tpl.Doc["Outputs"].(map[string]any)
	if get(outputs, "CdnDomainName", "Value", "Fn::GetAtt") == nil || get(outputs, "CdnUrl", "Value", "Fn::Sub") != "https://${ApiCdn.DomainName}" {
		t.Errorf("outputs CdnDomainName %v, CdnUrl %v; want the distribution's domain", outputs["CdnDomainName"], outputs["CdnUrl"])
	}
}

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
