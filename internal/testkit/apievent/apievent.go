// Package apievent builds the events API Gateway (HTTP API, payload format
// 2.0) passes the reserve function, for tests that call the handler
// directly: the route key and path parameters of the route the path
// matches, as API Gateway would fill them.
package apievent

import (
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
)

// New returns the event of method and path. A path no route matches gets
// no route key (API Gateway would not invoke the function at all).
func New(method, path, body string, headers map[string]string) events.APIGatewayV2HTTPRequest {
	key, params := Match(method, path)
	return events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: key, RawPath: path, Body: body, Headers: headers, PathParameters: params,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			RouteKey: key, Stage: "$default",
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: method, Path: path},
		},
	}
}

// Match finds the route key of method and path among the handler's routes,
// and the path's parameters.
func Match(method, path string) (string, map[string]string) {
	seg := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for _, key := range httpapi.Routes() {
		m, pattern, _ := strings.Cut(key, " ")
		if m != method {
			continue
		}
		want := strings.Split(strings.TrimPrefix(pattern, "/"), "/")
		if len(want) != len(seg) {
			continue
		}
		params := map[string]string{}
		ok := true
		for i, w := range want {
			switch {
			case strings.HasPrefix(w, "{") && strings.HasSuffix(w, "}") && seg[i] != "":
				params[strings.Trim(w, "{}")] = seg[i]
			case w != seg[i]:
				ok = false
			}
		}
		if ok {
			if len(params) == 0 {
				params = nil
			}
			return key, params
		}
	}
	return "", nil
}
