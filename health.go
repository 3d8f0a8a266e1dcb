package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
)

// What Health looks at: the connection, one round trip to JetStream, and the parts
// of the broker that deliver on their own (each hub, each Consume), which report a
// fault here rather than only in the log.

// part is one running delivery Health answers for: a hub or a Consume. Its fault is
// nil while it delivers.
type part struct {
	name  string
	fault atomic.Pointer[error]
}

func (p *part) fail(err error) { p.fault.Store(&err) }

func (p *part) heal() { p.fault.Store(nil) }

// addPart registers a running delivery named name with Health; forget takes it out
// again (its caller stopped it). On a closed broker it registers nothing.
func (c *natsCore) addPart(name string) (p *part, forget func()) {
	p = &part{name: name}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return p, func() {}
	}
	c.parts[p] = struct{}{}
	return p, func() {
		c.mu.Lock()
		delete(c.parts, p)
		c.mu.Unlock()
	}
}

// faults lists the registered parts' faults, ordered by name.
func (c *natsCore) faults() []error {
	c.mu.Lock()
	parts := make([]*part, 0, len(c.parts))
	for p := range c.parts {
		parts = append(parts, p)
	}
	c.mu.Unlock()
	slices.SortFunc(parts, func(a, b *part) int { return cmp.Compare(a.name, b.name) })
	var errs []error
	for _, p := range parts {
		if err := p.fault.Load(); err != nil {
			errs = append(errs, *err)
		}
	}
	return errs
}

// health is Health for both NATS brokers: closed, connected, one request (the
// history's stream info, which proves the connection, JetStream and the stream every
// hub and replay reads), then every running delivery's fault. extra is the broker's
// own finding, or nil.
func (c *natsCore) health(ctx context.Context, extra error) error {
	if ctx == nil {
		return errNilContext("health")
	}
	if err := c.checkOpen(); err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if !c.nc.IsConnected() {
		return fmt.Errorf("%w: health: not connected to nats (%s)", ErrUnavailable, c.nc.Status())
	}
	var errs []error
	if _, err := c.js.Stream(ctx, c.topo.HistoryStream); err != nil {
		errs = append(errs, c.mapRequestError("health: history stream "+c.topo.HistoryStream, err))
	}
	errs = append(errs, extra)
	errs = append(errs, c.faults()...)
	return errors.Join(errs...)
}

// HealthHandler serves h's Health as an HTTP probe: 200 "ok" when it returns nil, or
// 503 with the error's text. The request's context bounds the check, so a probe's
// timeout ends it. The text names streams, consumers and hubs, never a URL or a
// credential. A nil h fails every probe with ErrInvalidConfig's text: wiring that
// lost its broker must not pass for healthy, nor panic per request.
func HealthHandler(h HealthChecker) http.Handler {
	if h == nil {
		h = HealthFunc(nil)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := h.Health(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintln(w, err)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
}

// HealthFunc makes a function a HealthChecker, to narrow what a probe fails on; see
// HealthHandler.
type HealthFunc func(ctx context.Context) error

// Health calls f; a nil f is an error wrapping ErrInvalidConfig.
func (f HealthFunc) Health(ctx context.Context) error {
	if f == nil {
		return fmt.Errorf("%w: health: no checker", ErrInvalidConfig)
	}
	return f(ctx)
}
