package merchanthooks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"
	"time"
	"unicode/utf8"
)

// ErrPrivateAddress is a connection refused because the endpoint's address
// is not public (and Config.AllowPrivate is off).
var ErrPrivateAddress = errors.New("the address is not a public one")

// sharedAddressSpace is RFC 6598's carrier-grade NAT range, private in
// practice though not in net/netip's sense.
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

// IPv6 addresses that carry an IPv4 address a translator or relay takes
// the connection on to: NAT64's well-known prefix (RFC 6052, the IPv4
// address in the last 32 bits; an IPv6-only network's NAT64 gateway, such
// as a cloud's, reaches private IPv4 addresses of its network through it),
// its local-use prefix (RFC 8215, a network's own translator), and 6to4
// (RFC 3056, the IPv4 address in bits 16 to 47).
var (
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")
	nat64LocalUse  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour      = netip.MustParsePrefix("2002::/16")
)

// publicAddress reports whether a is an address a merchant's endpoint may
// have: not loopback, private (RFC 1918, unique local), link-local (which
// holds the cloud metadata address 169.254.169.254), unspecified, multicast
// or shared, nor an IPv6 address that a translator or relay turns into
// such an IPv4 address (64:ff9b::a00:1 is 10.0.0.1 behind NAT64).
func publicAddress(a netip.Addr) bool {
	a = a.Unmap().WithZone("") // a prefix contains no address with a zone
	b := a.As16()
	switch {
	case nat64WellKnown.Contains(a):
		return publicAddress(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(a):
		return publicAddress(netip.AddrFrom4([4]byte(b[2:6])))
	case nat64LocalUse.Contains(a):
		return false // where its IPv4 address goes is the local network's choice
	}
	return a.IsValid() && !a.IsLoopback() && !a.IsPrivate() && !a.IsLinkLocalUnicast() &&
		!a.IsLinkLocalMulticast() && !a.IsInterfaceLocalMulticast() && !a.IsMulticast() &&
		!a.IsUnspecified() && !sharedAddressSpace.Contains(a)
}

// NewHTTPClient is the client deliveries are sent with: no proxy, no
// redirect followed (a 3xx is a failed attempt), Timeout per attempt, and a
// dialer that checks the address it is about to connect to, after DNS
// resolution, so that a name that resolved to a public address at
// registration and to a private one now (DNS rebinding) is refused.
func NewHTTPClient(cfg Config) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		if cfg.AllowPrivate {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !publicAddress(ap.Addr()) {
			return fmt.Errorf("connecting to %s: %w", address, ErrPrivateAddress)
		}
		return nil
	}}
	// Connections are kept alive and reused, as many per host as one
	// process sends to at once (Workers x WorkerBatch, when every
	// delivery of the batches goes to one host): an endpoint answering a
	// steady stream of deliveries is not dialled again for each. A reused
	// connection goes to the address that was checked when it was dialled.
	idle := max(8, cfg.Workers*cfg.WorkerBatch)
	tr := &http.Transport{
		Proxy: nil, DialContext: dialer.DialContext, ForceAttemptHTTP2: true,
		TLSHandshakeTimeout: 5 * time.Second, MaxIdleConns: idle, MaxIdleConnsPerHost: idle, IdleConnTimeout: 60 * time.Second,
	}
	return &http.Client{Transport: tracedTransport(tr, cfg.TracerProvider), Timeout: cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// checkURL is the registration's check of an endpoint URL: absolute, https
// (http only with Config.AllowHTTP), no user information, a port (if any)
// from 1 to 65535, and a host whose every address is public (unless
// Config.AllowPrivate). It returns the reason it refuses, "" when it
// accepts, or an error when the host's resolver gave no answer. The connection is checked again when each delivery dials
// (NewHTTPClient).
func checkURL(ctx context.Context, cfg Config, raw string) (string, error) {
	if utf8.RuneCountInString(raw) > 2048 { // characters, as the column's CHECK counts them
		return "must be at most 2048 characters", nil
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return "must be an absolute URL such as https://example.com/webhooks", nil
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !cfg.AllowHTTP {
			return "must use https", nil
		}
	default:
		return "must use https", nil
	}
	if u.User != nil {
		return "must not carry user information", nil
	}
	if u.Fragment != "" {
		return "must not carry a fragment", nil
	}
	// url.Parse takes any digits for a port; no connection could be made
	// to one outside 1..65535.
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "must have a port from 1 to 65535, or none", nil
		}
	}
	if cfg.AllowPrivate {
		return "", nil
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if !publicAddress(a) {
			return "must not be a loopback, private, link-local or other non-public address", nil
		}
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resolver := cmp.Or(cfg.Resolver, net.DefaultResolver)
	addrs, err := resolver.LookupNetIP(ctx, "ip", host)
	var dns *net.DNSError
	if notFound := errors.As(err, &dns) && dns.IsNotFound; err != nil && !notFound {
		// The resolver gave no answer (a timeout, a server failure): not
		// the URL's fault, and not a refusal of it.
		return "", fmt.Errorf("resolving %s: %s", host, attemptError(err))
	}
	if err != nil || len(addrs) == 0 {
		return "must name a host that resolves", nil
	}
	for _, a := range addrs {
		if !publicAddress(a) {
			return "must not resolve to a loopback, private, link-local or other non-public address", nil
		}
	}
	return "", nil
}

// attemptError is an attempt's error as the merchant reads it in the
// deliveries' history: a DNS failure names the host, and not the address
// of this network's resolver, which Go's error also gives.
func attemptError(err error) string {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		dns.Server = ""
	}
	return err.Error()
}
