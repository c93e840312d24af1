// Package faultproxy is a TCP proxy for fault-injection tests: put it
// between holdfast and Redis or MySQL and make the network slow, silent,
// refusing or resetting, for real, while the servers themselves stay up.
package faultproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from Addr to an upstream address.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	latency   time.Duration // added before each reply chunk reaches the client
	blackhole bool          // hold connections open, forward nothing
	refuse    bool          // close new connections at once
	dropReply bool          // forward requests, lose the replies and reset
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
	sent      atomic.Int64 // chunks read from clients and forwarded upstream
}

// Start listens on a free loopback port and forwards to upstream.
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is where clients connect.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Sent counts the chunks clients sent that went upstream: for MySQL's
// protocol, about one a statement (a test counts what a path asks).
func (p *Proxy) Sent() int64 { return p.sent.Load() }

// counted counts each non-empty read of r in n.
type counted struct {
	r io.Reader
	n *atomic.Int64
}

func (c counted) Read(b []byte) (int, error) {
	k, err := c.r.Read(b)
	if k > 0 {
		c.n.Add(1)
	}
	return k, err
}

// SetLatency delays every reply by d (0 for none).
func (p *Proxy) SetLatency(d time.Duration) { p.mu.Lock(); p.latency = d; p.mu.Unlock() }

// Blackhole makes the upstream silent: requests are swallowed, nothing comes
// back, so clients time out. Off restores forwarding for new connections.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	p.mu.Unlock()
	if on {
		p.ResetAll()
	}
}

// Refuse closes every new connection at once (a server that is down).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
	if on {
		p.ResetAll()
	}
}

// DropReplies forwards requests upstream but loses every reply and closes
// the connection: the server did the work, the client never hears of it (the
// case that makes clients retry).
func (p *Proxy) DropReplies(on bool) { p.mu.Lock(); p.dropReply = on; p.mu.Unlock() }

// ResetAll closes every open connection (peers see resets or EOF).
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		_ = c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, hole := p.refuse, p.blackhole
		p.mu.Unlock()
		if refuse {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
			continue
		}
		p.track(c, true)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.track(c, false)
			defer c.Close()
			if hole {
				_, _ = io.Copy(io.Discard, c) // swallow until the client gives up
				return
			}
			up, err := net.DialTimeout("tcp", p.upstream, time.Second)
			if err != nil {
				return
			}
			p.track(up, true)
			defer p.track(up, false)
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, counted{c, &p.sent}); done <- struct{}{} }()
			go func() { p.replies(c, up); done <- struct{}{} }()
			<-done
		}()
	}
}

// replies copies upstream → client, delaying each chunk by the latency.
func (p *Proxy) replies(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			d, hole, drop := p.latency, p.blackhole, p.dropReply
			p.mu.Unlock()
			if hole {
				return
			}
			if drop {
				_ = dst.Close() // FIN: the client reads EOF, which go-redis retries
				return
			}
			if d > 0 {
				time.Sleep(d) // the injected fault itself: a slow network
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
