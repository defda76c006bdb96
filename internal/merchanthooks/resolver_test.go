package merchanthooks_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/idempay/idempay/internal/apitest"
)

// TestRegistrationWhenDNSGivesNoAnswer: a host whose resolver gives no
// answer (a server failure) is not the URL's fault: the creation is a 503
// with Retry-After that stores nothing, and the same key creates the
// endpoint once DNS answers. A host that does not exist (NXDOMAIN) is the
// URL's fault: a 400 naming url.
func TestRegistrationWhenDNSGivesNoAnswer(t *testing.T) {
	t.Parallel()
	dns := newStubDNS(t)
	cfg := apitest.MerchantHooksConfig()
	cfg.AllowPrivate = false
	cfg.Resolver = dns.resolver()
	env := apitest.New(t, apitest.Options{MerchantHooks: &cfg})
	c := env.NewClient(t)
	create := func(key string) *apitest.Response {
		return c.Post("/v1/webhook_endpoints", key, map[string]any{"url": "https://hooks.example.com/in", "enabled_events": []string{"*"}})
	}

	dns.rcode.Store(int32(dnsmessage.RCodeServerFailure))
	key := apitest.NewKey()
	if r := create(key); r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a creation while DNS fails: %s, want 503 with Retry-After", r)
	}
	dns.rcode.Store(int32(dnsmessage.RCodeSuccess))
	if r := create(key); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same key once DNS answers: %s, want a fresh 201", r)
	}

	dns.rcode.Store(int32(dnsmessage.RCodeNameError))
	if r := create(apitest.NewKey()); r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "resolves") {
		t.Fatalf("a host that does not exist: %s, want 400 naming url", r)
	}
}

// stubDNS answers every query on a UDP socket of its own with rcode: A
// 93.184.216.34 (a public address) on success, no record otherwise.
type stubDNS struct {
	conn  net.PacketConn
	rcode atomic.Int32
}

func newStubDNS(t *testing.T) *stubDNS {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &stubDNS{conn: conn}
	go s.serve()
	return s
}

func (s *stubDNS) serve() {
	buf := make([]byte, 512)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		rcode := dnsmessage.RCode(s.rcode.Load())
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: rcode})
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		if rcode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60},
				dnsmessage.AResource{A: [4]byte{93, 184, 216, 34}})
		}
		msg, err := b.Finish()
		if err != nil {
			continue
		}
		_, _ = s.conn.WriteTo(msg, from)
	}
}

// resolver asks only this server, over UDP.
func (s *stubDNS) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
	}}
}
