//go:build integration

package mq

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// loopbackProxy forwards a client's TCP connections to a NATS server on loopback, so a
// test can lose what the server sends, or cut the client's connection, without
// touching the server or mocking anything in between.
type loopbackProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	conns    map[net.Conn]bool
	dropping bool
	dropped  []byte // what dropping discarded, up to maxKeptDropped bytes
	holding  bool
	released *sync.Cond // holding ended
	wg       sync.WaitGroup
}

// newLoopbackProxy listens on a loopback port and forwards every connection to target
// (host:port); it closes everything at cleanup.
func newLoopbackProxy(t *testing.T, target string) *loopbackProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &loopbackProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.released = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

// URL is the address clients connect to instead of the server's.
func (p *loopbackProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// dropFromServer discards, from now on, everything the server sends on the open
// connections: the client's requests still arrive, their answers never do. The
// connections stay open, so the client does not notice until it times out.
func (p *loopbackProxy) dropFromServer() {
	p.mu.Lock()
	p.dropping = true
	p.mu.Unlock()
}

// holdFromClient keeps, from now on, what the clients send on the open connections
// until release: their requests reach the server late, in order.
func (p *loopbackProxy) holdFromClient() {
	p.mu.Lock()
	p.holding = true
	p.mu.Unlock()
}

// release forwards what holdFromClient kept, and everything after.
func (p *loopbackProxy) release() {
	p.mu.Lock()
	p.holding = false
	p.released.Broadcast()
	p.mu.Unlock()
}

// resume forwards what the server sends again, on the connections still open: what
// was dropped meanwhile stays lost, as the answers a short outage swallowed are.
func (p *loopbackProxy) resume() {
	p.mu.Lock()
	p.dropping = false
	p.mu.Unlock()
}

// cut closes every open connection, as a failed node or network would; connections
// made afterwards forward everything again.
func (p *loopbackProxy) cut() {
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
	p.dropping, p.holding = false, false
	p.released.Broadcast()
	p.mu.Unlock()
}

func (p *loopbackProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(client, server, false)
		go p.pump(server, client, true)
	}
}

// pump copies from src to dst until either closes; fromServer bytes are discarded
// while dropping.
func (p *loopbackProxy) pump(src, dst net.Conn, fromServer bool) {
	defer p.wg.Done()
	defer func() { _ = src.Close(); _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !fromServer {
			p.waitWhileHeld()
		}
		if n > 0 && (!fromServer || !p.droppedNow(buf[:n])) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *loopbackProxy) waitWhileHeld() {
	p.mu.Lock()
	for p.holding {
		p.released.Wait()
	}
	p.mu.Unlock()
}

// droppedNow reports whether b, read from a server, is to be discarded, and keeps it
// for hasDropped if so.
func (p *loopbackProxy) droppedNow(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropping && len(p.dropped) < maxKeptDropped {
		p.dropped = append(p.dropped, b[:min(len(b), maxKeptDropped-len(p.dropped))]...)
	}
	return p.dropping
}

// maxKeptDropped bounds what the proxy keeps of what it dropped.
const maxKeptDropped = 1 << 20

// hasDropped reports whether what the server sent while dropping contained marker.
func (p *loopbackProxy) hasDropped(marker string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.dropped, []byte(marker))
}
