package stripeevents_test

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/idempay/idempay/internal/stripeevents"
)

// docs/webhooks.md says what each Stripe event does to the ledger: its
// table names exactly the types that move it (stripeevents.HandledTypes).
func TestWebhookDocsListHandledTypes(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	// The first cell of a table row: `type`, `type` ...
	row := regexp.MustCompile("(?m)^\\| ((?:`[a-z_.]+`(?:, )?)+) \\|")
	typ := regexp.MustCompile("`([a-z_.]+)`")
	var listed []string
	for _, m := range row.FindAllStringSubmatch(string(raw), -1) {
		for _, tm := range typ.FindAllStringSubmatch(m[1], -1) {
			listed = append(listed, tm[1])
		}
	}
	slices.Sort(listed)
	want := slices.Sorted(slices.Values(stripeevents.HandledTypes))
	if !slices.Equal(listed, want) {
		t.Errorf("docs/webhooks.md's event table lists %q, want the handled types %q", listed, want)
	}
}
