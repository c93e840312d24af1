package main

// The strict decoder's cost on the reserve path (issue 20, part 4): a
// typical reserve body decoded as the API did before (encoding/json with
// DisallowUnknownFields, then a check that nothing follows the object) and
// as every route decodes it now (httpapi.UnmarshalBody: encoding/json/v2
// semantics), side by side in one run, ns/op and allocs/op, one goroutine.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/handlers/httpapi"
)

// reserveFields is the reserve route's body (httpapi's reserveBody).
type reserveFields struct {
	SKU     string `json:"sku"`
	Qty     *int   `json:"qty"`
	UserID  string `json:"user_id"`
	GroupID string `json:"group_id"`
}

// v1Decode is the decoding the API did before: case-insensitive names, the
// last of repeated members wins.
func v1Decode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the object")
	}
	return nil
}

const (
	modeDecodeV1     = "reserve body, encoding/json (before)"
	modeDecodeStrict = "reserve body, strict json/v2 (after)"
	modeJoinV1       = "join body, encoding/json (before)"
	modeJoinStrict   = "join body, strict json/v2 (after)"
)

func (b *bench) decodeCost(context.Context) error {
	buy := []byte(`{"sku":"demo-phone","qty":1}`)
	join := []byte(`{"sku":"demo-phone","qty":1,"group_id":"g-3kq4vyd2o7xbrlmsu5e6wafjni"}`)
	for _, m := range []struct {
		name   string
		body   []byte
		decode func([]byte, any) error
	}{
		{modeDecodeV1, buy, v1Decode}, {modeDecodeStrict, buy, httpapi.UnmarshalBody},
		{modeJoinV1, join, v1Decode}, {modeJoinStrict, join, httpapi.UnmarshalBody},
	} {
		b.log("decode: %s …", m.name)
		var failed error
		r := testing.Benchmark(func(tb *testing.B) {
			tb.ReportAllocs()
			for range tb.N {
				var v reserveFields
				if err := m.decode(m.body, &v); err != nil || v.Qty == nil || *v.Qty != 1 {
					failed = fmt.Errorf("%s: %s decoded as %+v: %v", m.name, m.body, v, err)
					tb.FailNow()
				}
			}
		})
		if failed != nil {
			return failed
		}
		b.results = append(b.results, result{group: "decode", name: m.name, ops: int64(r.N), elapsed: r.T,
			extra: map[string]string{"decode": fmt.Sprintf("%d ns/op, %d allocs/op, %d B/op", r.NsPerOp(), r.AllocsPerOp(), r.AllocedBytesPerOp())}})
	}
	return nil
}

// decodeLine compares the two decoders on the buy body, and with the
// handler's CPU per accepted reservation when the cpu part ran.
func (b *bench) decodeLine() []string {
	v1, ok1 := b.find(modeDecodeV1)
	v2, ok2 := b.find(modeDecodeStrict)
	if !ok1 || !ok2 {
		return nil
	}
	per := func(r result) time.Duration { return r.elapsed / time.Duration(max(r.ops, 1)) }
	line := fmt.Sprintf("strict decoder on a reserve body: %v → %v per body (%s → %s)", per(v1), per(v2), v1.extra["decode"], v2.extra["decode"])
	if cpu, ok := b.find(modeHandlerDirect); ok {
		perAccepted := time.Duration(float64(time.Microsecond) * parseMicros(cpu.extra["handler CPU"]))
		if d := per(v2) - per(v1); perAccepted > 0 {
			verb := "costs"
			if d < 0 {
				verb, d = "saves", -d
			}
			line += fmt.Sprintf("; it %s %v per accepted reservation, %.1f%% of the reserve handler's CPU (%v)",
				verb, d, 100*float64(d)/float64(perAccepted), perAccepted)
		}
	}
	return []string{line}
}

// parseMicros reads the number of a "123 µs/accepted" figure (0 if none).
func parseMicros(s string) float64 {
	var f float64
	_, _ = fmt.Sscanf(s, "%f", &f)
	return f
}
