package httpapi_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
)

// review6RuntimeDecode is the event exactly as the runtime library decoded
// it before fc50017: lambda.NewHandler around a typed handler, i.e.
// json.NewDecoder(payload).Decode(&event) (a Decoder, not json.Unmarshal).
func review6RuntimeDecode(payload []byte) (events.APIGatewayV2HTTPRequest, error) {
	var got events.APIGatewayV2HTTPRequest
	h := lambda.NewHandler(func(_ context.Context, e events.APIGatewayV2HTTPRequest) (struct{}, error) {
		got = e
		return struct{}{}, nil
	})
	_, err := h.Invoke(context.Background(), payload)
	return got, err
}

func review6Compare(t *testing.T, payload string) {
	t.Helper()
	want, wantErr := review6RuntimeDecode([]byte(payload))
	got, err := httpapi.DecodeEvent([]byte(payload))
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("DecodeEvent error %v; the runtime library's (encoding/json Decoder) %v", err, wantErr)
	}
	if err != nil {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("DecodeEvent =\n%#v\nruntime library =\n%#v", got, want)
	}
}

// Cases that hold: what API Gateway really sends, and client-controlled
// content inside the strings API Gateway writes.
func TestReview6DecodeHolds(t *testing.T) {
	for name, payload := range map[string]string{
		"real event":               apiGatewayEvent,
		"U+2028 and html in body":  `{"version":"2.0","body":"<a>&\u2028\u2029</a>"}`,
		"NUL escape":               `{"version":"2.0","body":"a\u0000b","headers":{"x\u0000":"\u0000"}}`,
		"paired surrogate escapes": `{"version":"2.0","body":"\ud83d\ude00"}`,
		"raw invalid UTF-8 bytes":  "{\"version\":\"2.0\",\"body\":\"\xff\xfe\xc0\x80\xe2\x82\xed\xa0\x80\xf4\x90\x80\x80\xf8\x88\x80\x80\x80\"}",
		"invalid UTF-8 in map key": "{\"version\":\"2.0\",\"headers\":{\"a\xff\":\"1\",\"a\xfe\":\"2\"}}",
		"timeEpoch max int64":      `{"version":"2.0","requestContext":{"timeEpoch":9223372036854775807}}`,
		"timeEpoch beyond 2^53":    `{"version":"2.0","requestContext":{"timeEpoch":9007199254740993}}`,
		"timeEpoch -0":             `{"version":"2.0","requestContext":{"timeEpoch":-0}}`,
		"timeEpoch 1.0":            `{"version":"2.0","requestContext":{"timeEpoch":1.0}}`,
		"timeEpoch 1e3":            `{"version":"2.0","requestContext":{"timeEpoch":1e3}}`,
		"timeEpoch overflow":       `{"version":"2.0","requestContext":{"timeEpoch":9223372036854775808}}`,
		"timeEpoch string":         `{"version":"2.0","requestContext":{"timeEpoch":"1"}}`,
		"claim a number":           `{"version":"2.0","requestContext":{"authorizer":{"jwt":{"claims":{"sub":"ann","iat":1}}}}}`,
		"claims repeated":          `{"version":"2.0","requestContext":{"authorizer":{"jwt":{"claims":{"sub":"ann","sub":"bob"}}}}}`,
		"claims objects repeated":  `{"version":"2.0","requestContext":{"authorizer":{"jwt":{"claims":{"sub":"ann"}}},"authorizer":{"jwt":{"claims":{"aud":"x"}}}}}`,
		"headers repeated":         `{"version":"2.0","headers":{"a":"1"},"headers":{"b":"2","a":"3"}}`,
		"header null value":        `{"version":"2.0","headers":{"a":"1","a":null}}`,
		"cookies repeated":         `{"version":"2.0","cookies":["a","b","c"],"cookies":["d"]}`,
		"cookie null":              `{"version":"2.0","cookies":["a",null]}`,
		"lambda ctx numbers":       `{"version":"2.0","requestContext":{"authorizer":{"lambda":{"n":9007199254740993,"f":1e308,"z":-0,"a":[1,{"b":null}]}}}}`,
		"case folded upper":        `{"VERSION":"2.0","ROUTEKEY":"POST /reservations","REQUESTCONTEXT":{"AUTHORIZER":{"JWT":{"CLAIMS":{"sub":"ann"}}}}}`,
		"Kelvin sign and long s":   `{"version":"2.0","route\u212aey":"POST /reservations","i\u017fBase64Encoded":true,"cookie\u017f":["a"]}`,
		"exact then folded":        `{"rawPath":"/b","RawPath":"/a"}`,
		"folded then exact":        `{"RawPath":"/a","rawPath":"/b"}`,
		"top-level null":           `null`,
		"empty":                    ``,
		"whitespace only":          " \n",
		"array":                    `[]`,
		"deep unknown 9000":        `{"x":` + strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + `}`,
		"deep unknown 10001":       `{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`,
		"raw control char":         "{\"body\":\"a\tb\"}",
		"bad escape":               `{"body":"\x41"}`,
		"lambda ctx 1e400":         `{"requestContext":{"authorizer":{"lambda":{"n":1e400}}}}`,
	} {
		t.Run(name, func(t *testing.T) { review6Compare(t, payload) })
	}
}

// Differences found.
func TestReview6TrailingDataAfterTheEvent(t *testing.T) {
	// The runtime library used json.Decoder.Decode, which reads the first
	// value and ignores what follows; jsonv2.Unmarshal refuses it.
	review6Compare(t, `{"version":"2.0","rawPath":"/a"} trailing`)
}

func TestReview6TwoValues(t *testing.T) {
	review6Compare(t, `{"version":"2.0"}{"version":"1.0"}`)
}

func TestReview6UnpairedSurrogateEscape(t *testing.T) {
	// encoding/json replaces an unpaired \ud800 with U+FFFD.
	review6Compare(t, `{"version":"2.0","body":"a\ud800b","headers":{"x":"\udc00"},"rawQueryString":"\ud800\u0041"}`)
}

func TestReview6DelimiterIgnoringCaseFold(t *testing.T) {
	// v2's MatchCaseInsensitiveNames ignores '_' and '-'; encoding/json
	// (strings.EqualFold) does not: "raw_path" is an unknown member to it.
	review6Compare(t, `{"version":"2.0","rawPath":"/real","raw_path":"/injected","is-base64-encoded":true,"request_context":{"time_epoch":1}}`)
}

func TestReview6NullAfterAValue(t *testing.T) {
	// encoding/json leaves a string, bool, int or struct as it was on a
	// null; v2 zeroes it.
	review6Compare(t, `{"version":"2.0","rawPath":"/a","rawPath":null,"isBase64Encoded":true,"isBase64Encoded":null,"requestContext":{"http":{"method":"POST"},"http":null}}`)
}

func TestReview6LambdaContextRepeatedObjectMerged(t *testing.T) {
	// encoding/json replaces a map value; v2 merges a repeated object into
	// the interface value already in the map.
	payload := `{"version":"2.0","requestContext":{"authorizer":{"lambda":{"a":{"x":1},"a":{"y":2}}}}}`
	want, _ := review6RuntimeDecode([]byte(payload))
	got, err := httpapi.DecodeEvent([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	if g, w := got.RequestContext.Authorizer.Lambda, want.RequestContext.Authorizer.Lambda; !reflect.DeepEqual(g, w) {
		t.Errorf("authorizer.lambda = %v, the runtime library's %v", g, w)
	}
}

// The response: the runtime library's encoding/json (SetEscapeHTML(false),
// trailing newline stripped) against Invoke's v2 encoding, as API Gateway
// reads them.
func TestReview6Response(t *testing.T) {
	h := httpapi.New(nil, nil)
	for name, payload := range map[string]string{
		"404 with client text": strings.Replace(apiGatewayEvent, `"routeKey":"POST /reservations"`, "\"routeKey\":\"GET /x<\u2028>&\xff\\ud800\"", 2),
		"401":                  strings.Replace(apiGatewayEvent, `"sub":"ann"`, `"sub":""`, 1),
	} {
		t.Run(name, func(t *testing.T) {
			oldOut, oldErr := lambda.NewHandler(h.Handle).Invoke(context.Background(), []byte(payload))
			newOut, newErr := lambda.NewHandler(httpapi.Invoker(h.Invoke)).Invoke(context.Background(), []byte(payload))
			if (oldErr != nil) != (newErr != nil) {
				t.Fatalf("errors differ: old %v new %v", oldErr, newErr)
			}
			if !utf8.Valid(newOut) {
				t.Errorf("new response is not valid UTF-8: %q", newOut)
			}
			var o, n map[string]any
			if err := json.Unmarshal(oldOut, &o); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(newOut, &n); err != nil {
				t.Fatal(err)
			}
			if _, ok := o["isBase64Encoded"]; !ok && n["isBase64Encoded"] == false {
				t.Logf("note: v2 writes \"isBase64Encoded\":false where v1 omits it (omitempty on a bool)")
				delete(n, "isBase64Encoded")
			}
			if !reflect.DeepEqual(o, n) {
				t.Errorf("response read differently:\nold %s\nnew %s", oldOut, newOut)
			}
			if string(oldOut) != string(newOut) {
				t.Logf("bytes differ (same JSON value):\nold %s\nnew %s", oldOut, newOut)
			}
		})
	}
}
