package httpapi_test

import (
	"testing"
)

// Every body the API accepts is read as its document defines it, and only so
// (issue 20, part 4: a WAF or a client reading the first "qty" must see the
// request the handler executes): a member name matches its field exactly,
// case included; a member appears at most once; a member the body does not
// define is refused and named. Each such body is 400 invalid_request and
// reaches nothing.
func TestBodiesAreDecodedStrictly(t *testing.T) {
	type route struct{ name, method, path, valid string }
	routes := []route{
		{"reserve", "POST", "/reservations", `{"sku":"s","qty":1`},
		{"join", "POST", "/reservations", `{"sku":"s","qty":1,"group_id":"g-1"`},
		{"group", "POST", "/groups", `{"sku":"s","capacity":3,"ttl_seconds":60`},
		{"stock", "PUT", "/admin/skus/s/stock", `{"stock":9,"per_user_limit":1,"rate_per_second":2,"burst":2,"buckets":1,"version":3`},
		{"add", "PUT", "/admin/skus/s/stock", `{"add":1,"pay_within_seconds":900`},
		{"room", "PUT", "/admin/skus/s/stock", `{"add":0,"waiting_room":true,"admit_factor":2`},
		{"order cancel", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{"reason":"fraud"`},
	}
	// A member of each body, its value, and the same name folded.
	member := map[string][3]string{
		"reserve":      {"qty", "3", "Qty"},
		"join":         {"group_id", `"g-2"`, "GROUP_ID"},
		"group":        {"capacity", "1000", "Capacity"},
		"stock":        {"stock", "1", "STOCK"},
		"add":          {"add", "1000", "Add"},
		"room":         {"waiting_room", "false", "Waiting_Room"},
		"order cancel": {"reason", `"customer:changed-mind"`, "Reason"},
	}
	for _, r := range routes {
		m := member[r.name]
		cases := []struct{ name, body, message string }{
			{"a repeated member", r.valid + `,"` + m[0] + `":` + m[1] + `}`,
				`duplicate field "` + m[0] + `": each member may appear once`},
			{"a repeated member spelt with an escape", r.valid + `,"\u00` + hex(m[0][0]) + m[0][1:] + `":` + m[1] + `}`,
				`duplicate field "` + m[0] + `": each member may appear once`},
			{"a case-folded member", r.valid + `,"` + m[2] + `":` + m[1] + `}`,
				`unknown field "` + m[2] + `" (member names are case-sensitive: "` + m[0] + `")`},
			{"a case-folded name alone", `{"` + m[2] + `":` + m[1] + `}`,
				`unknown field "` + m[2] + `" (member names are case-sensitive: "` + m[0] + `")`},
			{"an unknown member", r.valid + `,"colour":"red"}`, `unknown field "colour"`},
			// No member is nullable: a null read as "absent" would be one
			// request to a schema validator and another to the handler.
			{"a member given as null", `{"` + m[0] + `":null}`,
				`field "` + m[0] + `" must not be null`},
		}
		if r.name == "reserve" {
			// encoding/json folds Unicode too: U+017F (ſ) matched "s".
			cases = append(cases, struct{ name, body, message string }{
				"a Unicode-folded member", `{"qty":1,"ſku":"s"}`, `unknown field "ſku" (member names are case-sensitive: "sku")`})
		}
		for _, c := range cases {
			t.Run(r.name+"/"+c.name, func(t *testing.T) {
				svc := &stub{}
				code, body := do(t, svc, request(r.method, r.path, c.body, nil))
				if code != 400 || body["error"] != "invalid_request" || body["message"] != c.message {
					t.Errorf("%s %s %s = %d %v, want 400 invalid_request %q", r.method, r.path, c.body, code, body, c.message)
				}
				if svc.calls != 0 {
					t.Errorf("%s reached the service (%d calls)", c.body, svc.calls)
				}
			})
		}
		t.Run(r.name+"/the body as defined", func(t *testing.T) {
			svc := &stub{}
			if code, body := do(t, svc, request(r.method, r.path, r.valid+`}`, nil)); code >= 300 || svc.calls != 1 {
				t.Errorf("%s %s %s} = %d %v (%d calls), want it served", r.method, r.path, r.valid, code, body, svc.calls)
			}
		})
	}
	for _, c := range []struct{ name, body, message string }{
		{"invalid UTF-8", "{\"sku\":\"s\xff\",\"qty\":1}", "body is not valid JSON"},
		{"an array", `[{"sku":"s","qty":1}]`, "body must be a JSON object"},
		{"a number", `1`, "body must be a JSON object"},
		{"two objects", `{"sku":"s","qty":1}{"sku":"s","qty":3}`, "body has data after the JSON object"},
		{"a type", `{"sku":"s","qty":"3"}`, `field "qty" must be an integer`},
		{"a null group_id", `{"sku":"s","qty":1,"group_id":null}`, `field "group_id" must not be null`},
		{"a null user_id", `{"sku":"s","qty":1,"user_id":null}`, `field "user_id" must not be null`},
		{"an empty group_id", `{"sku":"s","qty":1,"group_id":""}`, `group_id must name a group`},
	} {
		t.Run("reserve/"+c.name, func(t *testing.T) {
			svc := &stub{}
			code, body := do(t, svc, request("POST", "/reservations", c.body, nil))
			if msg, _ := body["message"].(string); code != 400 || body["error"] != "invalid_request" || len(msg) < len(c.message) || msg[:len(c.message)] != c.message {
				t.Errorf("%q = %d %v, want 400 invalid_request starting %q", c.body, code, body, c.message)
			}
			if svc.calls != 0 {
				t.Errorf("%q reached the service", c.body)
			}
		})
	}
}

func hex(b byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}
