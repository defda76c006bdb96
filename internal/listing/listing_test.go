package listing_test

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/listing"
)

func TestLimit(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"": listing.DefaultLimit, "1": 1, "100": 100, "42": 42} {
		if got, err := listing.Limit(in); err != nil || got != want {
			t.Errorf("Limit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"0", "101", "-1", "ten", "1.5", " 5"} {
		_, err := listing.Limit(in)
		var pe *apierror.Error
		if !errors.As(err, &pe) || len(pe.InvalidParams) != 1 || pe.InvalidParams[0].Name != "limit" {
			t.Errorf("Limit(%q): %v; want a 400 naming limit", in, err)
		}
	}
}

func TestPage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rows, limit int
		want        []string
		more        bool
	}{
		{0, 3, []string{}, false},
		{2, 3, []string{"0", "1"}, false},
		{3, 3, []string{"0", "1", "2"}, false},
		{4, 3, []string{"0", "1", "2"}, true}, // the extra row only says more follow
	} {
		rows := make([]int, tc.rows)
		for i := range rows {
			rows[i] = i
		}
		p := listing.Page(rows, tc.limit, strconv.Itoa)
		if p.Object != "list" || p.Data == nil || !slices.Equal(p.Data, tc.want) || p.HasMore != tc.more {
			t.Errorf("Page(%d rows, limit %d) = object %q, data %#v, has_more %v; want \"list\", %q (never nil: it encodes as []), %v",
				tc.rows, tc.limit, p.Object, p.Data, p.HasMore, tc.want, tc.more)
		}
	}
}
