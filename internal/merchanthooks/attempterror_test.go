package merchanthooks_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// TestAttemptErrorNamesNoResolver: an attempt whose host does not resolve
// records why, and the merchant reads it in the deliveries' history; it
// names the host, not the address of this network's DNS resolver (Go's
// error says "lookup HOST on RESOLVER:53"). .invalid never resolves (RFC
// 6761, section 6.4).
func TestAttemptErrorNamesNoResolver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp := b.client.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{
		"url": "http://nowhere.invalid/hooks", "enabled_events": []string{"*"}})
	if resp.Status != http.StatusCreated {
		t.Fatalf("creating the endpoint: %d %s", resp.Status, resp.Body)
	}
	id := b.event(t, events.ChargeSucceeded, "ch_dns", 1)
	b.dispatch(t)
	if n := b.work(t); n != 1 {
		t.Fatalf("claimed %d, want the one delivery", n)
	}
	r := b.client.Get("/v1/events/" + id + "/deliveries")
	var page merchanthooks.DeliveryList
	r.JSON(t, &page)
	if len(page.Data) != 1 || len(page.Data[0].Attempts) != 1 || page.Data[0].Attempts[0].Error == nil {
		t.Fatalf("deliveries: %s, want one with one failed attempt", r.Body)
	}
	got := *page.Data[0].Attempts[0].Error
	if !strings.Contains(got, "lookup nowhere.invalid") {
		t.Errorf("the attempt's error %q does not say the host did not resolve", got)
	}
	if resolver := regexp.MustCompile(` on \S+:53\b`); resolver.MatchString(got) {
		t.Errorf("the attempt's error %q names the resolver's address", got)
	}
}
