package devstack_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// What API Gateway answers 404 (HEAD on a GET route, paths that are not
// clean) the dev gateway answers 404 too: ServeMux alone would invoke the
// handler or redirect.
func TestGatewayAnswers404LikeAPIGateway(t *testing.T) {
	srv, iss, rec := gateway(t)
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, c := range []struct{ method, path string }{
		{"HEAD", "/skus/demo-phone"}, // API Gateway: no HEAD route; ServeMux: GET matches HEAD
		{"HEAD", "/admin/skus/demo-phone/stock"},
		{"GET", "//skus/demo-phone"},  // ServeMux: 301 to the cleaned path
		{"GET", "/skus/./demo-phone"}, // ServeMux: 301
		{"GET", "/reservations/../skus/demo-phone"},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		req.URL.Opaque = c.path // send the path as written (no client-side cleaning)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		evs := rec.take()
		if resp.StatusCode != http.StatusNotFound || len(evs) != 0 {
			key := ""
			if len(evs) > 0 {
				key = evs[0].RouteKey + " (method " + evs[0].RequestContext.HTTP.Method + ")"
			}
			t.Errorf("%s %s = %d (Location %q), handler invoked %d times %s; want API Gateway's 404 {\"message\":\"Not Found\"}",
				c.method, c.path, resp.StatusCode, resp.Header.Get("Location"), len(evs), key)
		}
	}
}

// A percent-encoded slash reaches the handler decoded, as one parameter.
func TestGatewayDecodesEncodedSlash(t *testing.T) {
	srv, iss, rec := gateway(t)
	tok, _ := iss.Mint("ann", time.Hour)
	resp, _ := send(t, srv, "GET", "/skus/demo%2Fphone", "Bearer "+tok, "")
	evs := rec.take()
	if len(evs) == 1 {
		t.Logf("GET /skus/demo%%2Fphone -> %d, pathParameters %v rawPath %q", resp.StatusCode, evs[0].PathParameters, evs[0].RawPath)
	} else {
		t.Logf("GET /skus/demo%%2Fphone -> %d, not invoked", resp.StatusCode)
	}
}

func TestGatewayDoubleSlash(t *testing.T) {
	srv, iss, rec := gateway(t)
	tok, _ := iss.Mint("ann", time.Hour)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET //skus/demo-phone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", tok)
	b, _ := io.ReadAll(conn)
	line, _, _ := strings.Cut(string(b), "\r\n")
	if !strings.Contains(line, "404") || len(rec.take()) != 0 {
		t.Errorf("GET //skus/demo-phone = %q, want API Gateway's 404", line)
	}
}
