package httpapi_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
)

// apiGatewayEvent is an event as API Gateway's HTTP API passes it (payload
// 2.0), with a JWT authorizer's claims.
const apiGatewayEvent = `{"version":"2.0","routeKey":"POST /reservations","rawPath":"/reservations","rawQueryString":"a=1&b=%E2%82%AC",
"cookies":["c1=v1","c2=v2"],"headers":{"accept":"application/json","authorization":"Bearer eyJ.x.y","content-length":"25","content-type":"application/json",
"host":"abc123.execute-api.eu-west-1.amazonaws.com","idempotency-key":"k-1","user-agent":"Mozilla/5.0","x-forwarded-for":"203.0.113.7, 10.0.0.1"},
"queryStringParameters":{"a":"1","b":"€"},"pathParameters":{"id":"s.abc"},"stageVariables":{"v":"1"},
"requestContext":{"accountId":"123456789012","apiId":"abc123","authorizer":{"jwt":{"claims":{"sub":"ann","aud":"shop","iat":"1765000000","cognito:groups":"[buyers vip]"},"scopes":["read","write"]}},
"domainName":"abc123.execute-api.eu-west-1.amazonaws.com","domainPrefix":"abc123","http":{"method":"POST","path":"/reservations","protocol":"HTTP/1.1","sourceIp":"203.0.113.7","userAgent":"Mozilla/5.0"},
"requestId":"JKJaXmPLvHcESHA=","routeKey":"POST /reservations","stage":"$default","time":"06/Dec/2026:08:00:00 +0000","timeEpoch":1796544000000},
"body":"{\"sku\":\"s\",\"qty\":1,\"note\":\"\u003c\u2028\"}","isBase64Encoded":false}`

// Invoke reads the runtime's event as the Lambda runtime library (encoding/json)
// reads it: the fields API Gateway sends, unknown members ignored, a
// repeated member the last, case-folded names, invalid UTF-8 replaced, nulls.
func TestInvokeDecodesAsTheRuntimeLibraryDoes(t *testing.T) {
	for name, payload := range map[string]string{
		"API Gateway's event":    apiGatewayEvent,
		"an unknown member":      strings.Replace(apiGatewayEvent, `"version":"2.0"`, `"version":"2.0","newField":{"x":[1,2]}`, 1),
		"a repeated member":      strings.Replace(apiGatewayEvent, `"rawPath":"/reservations"`, `"rawPath":"/a","rawPath":"/reservations"`, 1),
		"a member's case folded": strings.Replace(apiGatewayEvent, `"rawPath"`, `"RawPath"`, 1),
		"invalid UTF-8":          strings.Replace(apiGatewayEvent, `"Mozilla/5.0"}`, "\"Mozilla\xff\"}", 1),
		"nulls":                  `{"version":"2.0","headers":null,"cookies":null,"body":null,"requestContext":{"authorizer":null}}`,
		"a base64 body":          `{"version":"2.0","body":"AAEC/w==","isBase64Encoded":true}`,
	} {
		t.Run(name, func(t *testing.T) {
			var want events.APIGatewayV2HTTPRequest // as the runtime library's json.Decoder reads it
			wantErr := json.NewDecoder(strings.NewReader(payload)).Decode(&want)
			got, err := httpapi.DecodeEvent([]byte(payload))
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("DecodeEvent error %v, encoding/json's %v", err, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("DecodeEvent =\n%+v\nencoding/json =\n%+v", got, want)
			}
		})
	}
	for name, payload := range map[string]string{"not JSON": `{"version":`, "not an object": `["2.0"]`, "a wrong type": `{"isBase64Encoded":"yes"}`} {
		_, err := httpapi.DecodeEvent([]byte(payload))
		var v events.APIGatewayV2HTTPRequest
		if wantErr := json.NewDecoder(strings.NewReader(payload)).Decode(&v); (err == nil) != (wantErr == nil) {
			t.Errorf("%s: DecodeEvent error %v, encoding/json's %v", name, err, wantErr)
		}
	}
}

// Through the runtime library: an Invoker is its lambda.Handler, and the
// response reads back as the handler's.
func TestInvokeThroughTheRuntimeLibrary(t *testing.T) {
	h := lambda.NewHandler(httpapi.Invoker(httpapi.New(nil, nil).Invoke))
	out, err := h.Invoke(context.Background(), []byte(strings.Replace(apiGatewayEvent, `"routeKey":"POST /reservations"`, `"routeKey":"GET /nowhere"`, 2)))
	if err != nil {
		t.Fatal(err)
	}
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(out, &resp); err != nil || resp.StatusCode != 404 || !strings.Contains(resp.Body, "not_found") {
		t.Errorf("Invoke = %s (%v), want the handler's 404 not_found", out, err)
	}
}
