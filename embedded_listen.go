package mq

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
)

// parseListenAddr splits a ListenAddr into its host and port, refusing one that cannot
// work with ErrInvalidConfig.
func parseListenAddr(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%w: embedded nats: listen address %q: %w", ErrInvalidConfig, addr, err)
	}
	if port, err = strconv.Atoi(p); err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w: embedded nats: listen address %q: port %q is not 0 to 65535", ErrInvalidConfig, addr, p)
	}
	return host, port, nil
}

// beyondLoopback reports whether a listener on host may be reached from another
// machine: an empty host or an unspecified address means every interface.
func beyondLoopback(host string) bool {
	ip, err := netip.ParseAddr(host) // unlike net.ParseIP, takes a zone ("::1%lo")
	return host != "localhost" && (err != nil || !ip.IsLoopback())
}

// checkListen binds addr once and lets it go. nats-server listens on a goroutine of
// its own and reports a failure only to its log, so an address it cannot take (a
// host that is no interface here, a name that does not resolve, a port in use) came
// back as a ready wait run out, ReadyTimeout later. An address that cannot be bound
// is ErrInvalidConfig; a port another listener holds, ErrUnavailable.
func checkListen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%w: embedded nats: listen address %q: %w", ErrUnavailable, addr, err)
	case err != nil:
		return fmt.Errorf("%w: embedded nats: listen address %q: %w", ErrInvalidConfig, addr, err)
	}
	return ln.Close()
}
