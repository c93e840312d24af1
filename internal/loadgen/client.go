package loadgen

// The load tool's HTTP client: tokens, requests, and the API calls a run makes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// token returns user's bearer token: TokenFor's, obtained once per user, or
// the one static Token.
func (r *runner) token(user string) (string, error) {
	if r.cfg.TokenFor == nil {
		return r.cfg.Token, nil
	}
	r.mu.Lock()
	t, ok := r.tokens[user]
	if !ok {
		t = &userToken{}
		r.tokens[user] = t
	}
	r.mu.Unlock()
	t.once.Do(func() {
		t.tok, t.err = r.cfg.TokenFor(user)
		if t.err == nil && t.tok == "" {
			t.err = errors.New("empty token")
		}
		if t.err != nil {
			t.err = fmt.Errorf("loadgen: token for %s: %w", user, t.err)
		}
	})
	return t.tok, t.err
}

// mintTokens gets every simulated user's token before the clock starts, so
// minting (or a token command) is not measured as the API's latency.
func (r *runner) mintTokens(ctx context.Context) error {
	if r.cfg.TokenFor == nil {
		return nil
	}
	users := make([]string, 0, r.cfg.N+r.cfg.Groups*(r.cfg.GroupCapacity+1))
	for i := range r.cfg.N {
		users = append(users, buyer(i))
	}
	for g := range r.cfg.Groups {
		for j := range r.cfg.GroupCapacity + 1 {
			users = append(users, groupUser(g, j))
		}
	}
	start := time.Now()
	var next, done atomic.Int64
	var failed atomic.Pointer[error]
	stop := make(chan struct{})
	if r.cfg.Progress != nil {
		go progress(r.cfg.Progress, "tokens ", &done, len(users), start, stop)
	}
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(users) || ctx.Err() != nil || failed.Load() != nil {
					return
				}
				if _, err := r.token(users[i]); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if r.cfg.Progress != nil {
		progressLine(r.cfg.Progress, "tokens ", int(done.Load()), len(users), start)
		fmt.Fprintln(r.cfg.Progress)
	}
	if err := failed.Load(); err != nil {
		return *err
	}
	return ctx.Err()
}

// do sends a buyer request as user (with user's token), or an admin request
// (signed by Sign) when user is "".
func (r *runner) do(ctx context.Context, method, path string, body any, user string) (int, map[string]any, error) {
	return r.doWith(ctx, method, path, body, user, nil)
}

func (r *runner) doWith(ctx context.Context, method, path string, body any, user string, headers map[string]string) (int, map[string]any, error) {
	return r.send(ctx, method, path, body, user, headers, false)
}

// public sends a request with no credentials at all: the waiting room's
// public status.
func (r *runner) public(ctx context.Context, path string) (int, map[string]any, error) {
	return r.send(ctx, http.MethodGet, path, nil, "", nil, true)
}

func (r *runner) send(ctx context.Context, method, path string, body any, user string, headers map[string]string, anonymous bool) (int, map[string]any, error) {
	var rd io.Reader
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(r.cfg.BaseURL, "/")+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	switch {
	case anonymous:
	case user == "":
		if r.cfg.Sign != nil {
			if err := r.cfg.Sign(req); err != nil {
				return 0, nil, err
			}
		}
	default:
		tok, err := r.token(user)
		if err != nil {
			return 0, nil, err
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, nil
}

func (r *runner) setStock(ctx context.Context, sku string, n int) error {
	// An existing SKU's figure is set against the version read just before
	// (the admin API's precondition); a new one needs none.
	var headers map[string]string
	if v, err := r.stock(ctx, sku); err == nil {
		headers = map[string]string{"If-Match": fmt.Sprintf("%q", fmt.Sprint(v.Version))}
	}
	code, body, err := r.doWith(ctx, http.MethodPut, "/admin/skus/"+sku+"/stock", map[string]any{"stock": n}, "", headers)
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("set stock of %s: %d %v %v", sku, code, body, err)
	}
	return nil
}

func (r *runner) stock(ctx context.Context, sku string) (StockView, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.cfg.BaseURL, "/")+"/admin/skus/"+sku+"/stock", nil)
	if err != nil {
		return StockView{}, err
	}
	if r.cfg.Sign != nil {
		if err := r.cfg.Sign(req); err != nil {
			return StockView{}, err
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return StockView{}, err
	}
	defer resp.Body.Close()
	var v StockView
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("stock of %s: %s", sku, resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

type groupView struct {
	Status  string `json:"status"`
	Members int    `json:"members"`
}

// group reads group round g (id) as the user who opened it.
func (r *runner) group(ctx context.Context, g int, id string) (groupView, error) {
	code, body, err := r.do(ctx, http.MethodGet, "/groups/"+id, nil, groupUser(g, 0))
	if err != nil || code != http.StatusOK {
		return groupView{}, fmt.Errorf("group %s: %d %v", id, code, err)
	}
	members, _ := body["members"].(float64)
	status, _ := body["status"].(string)
	return groupView{Status: status, Members: int(members)}, nil
}

func (r *runner) reserve(ctx context.Context, sku, user, group string) outcome {
	return r.reserveWith(ctx, sku, user, group, nil)
}

// reserveWith is reserve with these headers (a waiting room's Admission-Token).
func (r *runner) reserveWith(ctx context.Context, sku, user, group string, headers map[string]string) outcome {
	body := map[string]any{"sku": sku, "qty": 1}
	if r.cfg.TokenFor == nil {
		body["user_id"] = user // today's API without per-user tokens
	}
	if group != "" {
		body["group_id"] = group
	}
	o := outcome{start: time.Now(), sku: sku, user: user, group: group}
	code, resp, err := r.doWith(ctx, http.MethodPost, "/reservations", body, user, headers)
	o.latency = time.Since(o.start)
	o.status = code
	if err != nil {
		o.code = "transport"
		return o
	}
	if code == http.StatusAccepted {
		o.id, _ = resp["reservation_id"].(string)
	} else {
		o.code, _ = resp["error"].(string)
	}
	return o
}
