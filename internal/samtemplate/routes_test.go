package samtemplate_test

import (
	"path/filepath"
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
