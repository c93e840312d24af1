package httpapi

import (
	"bytes"
	"context"
	"fmt"

	"github.com/aws/aws-lambda-go/events"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Invoke is the function's entry as the Lambda runtime calls it: API
// Gateway's event (payload 2.0) as JSON in, the response as JSON out. It
// decodes the event with encoding/json/v2 where the runtime library would
// use encoding/json by reflection, which cost about as much CPU as the rest
// of a reserve call (docs/benchmarks.md). It reads what encoding/json
// reads: encoding/json's options (case-folded names, unknown members
// ignored, a repeated one the last, invalid UTF-8 replaced), the first
// value of the payload (TestInvokeDecodesAsTheRuntimeLibraryDoes, and a
// review's cases in review6_invoke_test.go).
func (h *Handler) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	req, err := DecodeEvent(payload)
	if err != nil {
		return nil, err
	}
	resp, err := h.Handle(ctx, req)
	if err != nil {
		return nil, err
	}
	out, err := jsonv2.Marshal(resp, eventOptions)
	if err != nil {
		return nil, fmt.Errorf("httpapi: encode the response: %w", err)
	}
	return out, nil
}

// DecodeEvent is Invoke's reading of the runtime's event: the first JSON
// value of payload, as the runtime library's json.Decoder read it.
func DecodeEvent(payload []byte) (events.APIGatewayV2HTTPRequest, error) {
	var req events.APIGatewayV2HTTPRequest
	if jsonv2.Unmarshal(payload, &req, eventOptions) == nil {
		return req, nil // one value, as every event is
	}
	// Anything else (something after the value, or no valid value) is
	// read again as a stream, which reads the first value alone: about
	// twice the CPU, for what API Gateway never sends.
	req = events.APIGatewayV2HTTPRequest{}
	if err := jsonv2.UnmarshalDecode(jsontext.NewDecoder(bytes.NewReader(payload), eventOptions), &req, eventOptions); err != nil {
		return req, fmt.Errorf("httpapi: decode the event: %w", err)
	}
	return req, nil
}

// eventOptions are encoding/json's semantics (v1's, with its repeated
// members and invalid UTF-8), for the runtime's JSON.
var eventOptions = jsonv2.JoinOptions(jsonv1.DefaultOptionsV1(), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

// Invoker is a lambda.Handler of a function of the runtime's bytes, such as
// Handler.Invoke wrapped by metrics.Flushing.
type Invoker func(ctx context.Context, payload []byte) ([]byte, error)

// Invoke implements lambda.Handler.
func (f Invoker) Invoke(ctx context.Context, payload []byte) ([]byte, error) { return f(ctx, payload) }
