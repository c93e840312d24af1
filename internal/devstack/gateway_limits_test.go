package devstack_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/devstack"
)

// rawHead sends a request whose request line plus header lines ("Name:
// value", line ends not counted) take exactly size bytes, and returns the
// answer.
func rawHead(t *testing.T, srv *httptest.Server, size int) (int, string) {
	t.Helper()
	line := "GET /admin/skus/demo-phone/stock HTTP/1.1"
	host := "Host: " + strings.TrimPrefix(srv.URL, "http://")
	pad := size - len(line) - len(host) - len("X-Pad: ")
	if pad < 1 {
		t.Fatalf("size %d too small", size)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s\r\n%s\r\nX-Pad: %s\r\n\r\n", line, host, strings.Repeat("p", pad)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a %d-byte head: %v", size, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// make dev's gateway keeps API Gateway's HTTP API quotas (issue 20, part 4):
// request line plus headers up to 10,240 bytes reach the function, above that
// the gateway answers 431 itself; a body up to the 10 MB payload quota is read
// whole and handed to the function (never a reset connection), above it the
// gateway answers 413 itself.
func TestGatewayKeepsAPIGatewaysLimits(t *testing.T) {
	srv, _, rec := gateway(t)

	t.Run("a head of 10240 bytes reaches the function", func(t *testing.T) {
		if status, body := rawHead(t, srv, devstack.MaxRequestHead); status != http.StatusTeapot {
			t.Errorf("a %d-byte head = %d %s, want the function's 418", devstack.MaxRequestHead, status, body)
		}
		if n := len(rec.take()); n != 1 {
			t.Errorf("the function ran %d times, want 1", n)
		}
	})
	t.Run("a head of 10241 bytes is API Gateway's 431", func(t *testing.T) {
		for _, size := range []int{devstack.MaxRequestHead + 1, 64 << 10} {
			status, body := rawHead(t, srv, size)
			if status != http.StatusRequestHeaderFieldsTooLarge || body != `{"message":"Request Header Fields Too Large"}` {
				t.Errorf("a %d-byte head = %d %s, want 431 {\"message\":\"Request Header Fields Too Large\"}", size, status, body)
			}
		}
		if n := len(rec.take()); n != 0 {
			t.Errorf("the function ran %d times for heads over the quota", n)
		}
	})

	for _, c := range []struct {
		name    string
		size    int
		chunked bool
	}{
		{"a 1 MiB body", 1 << 20, false},
		{"a 10 MB body", devstack.MaxPayload, false},
		{"a 10 MB body of unknown length", devstack.MaxPayload, true},
	} {
		t.Run(c.name+" is handed whole to the function", func(t *testing.T) {
			resp, body := sendBody(t, srv, c.size, c.chunked)
			if resp.StatusCode != http.StatusTeapot {
				t.Errorf("%d bytes = %d %s, want the function's 418", c.size, resp.StatusCode, body)
			}
			evs := rec.take()
			if len(evs) != 1 || len(evs[0].Body) != c.size {
				t.Errorf("the function got %d events, want one with the whole %d-byte body", len(evs), c.size)
			}
		})
	}
	for _, c := range []struct {
		name    string
		chunked bool
	}{{"with its length", false}, {"of unknown length", true}} {
		t.Run("a body over 10 MB "+c.name+" is API Gateway's 413", func(t *testing.T) {
			resp, body := sendBody(t, srv, devstack.MaxPayload+1, c.chunked)
			if resp.StatusCode != http.StatusRequestEntityTooLarge || body != `{"message":"Request Entity Too Large"}` {
				t.Errorf("%d bytes = %d %s, want 413 {\"message\":\"Request Entity Too Large\"}", devstack.MaxPayload+1, resp.StatusCode, body)
			}
			if n := len(rec.take()); n != 0 {
				t.Errorf("the function ran %d times for a body over the quota", n)
			}
		})
	}
}

// sendBody PUTs size bytes to an admin route (no token needed), with a
// Content-Length or chunked.
func sendBody(t *testing.T, srv *httptest.Server, size int, chunked bool) (*http.Response, string) {
	t.Helper()
	var r io.Reader = strings.NewReader(strings.Repeat(" ", size))
	if chunked {
		r = io.MultiReader(r) // hides the length: Transfer-Encoding: chunked
	}
	req, err := http.NewRequest("PUT", srv.URL+"/admin/skus/demo-phone/stock", r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%d bytes: %v (a reset connection, not an answer)", size, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}
