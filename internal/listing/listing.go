// Package listing is the shape the list endpoints share (GET /v1/charges,
// GET /v1/events, GET /v1/api_keys, an endpoint's deliveries; GET
// /v1/webhook_endpoints answers a List of every endpoint, in one page): the
// limit parameter, and a page of at most limit items that says whether more
// follow.
package listing

import (
	"strconv"

	"github.com/idempay/idempay/internal/apierror"
)

// DefaultLimit and MaxLimit bound the limit query parameter.
const (
	DefaultLimit = 10
	MaxLimit     = 100
)

// Limit parses the limit query parameter ("" is DefaultLimit). Anything but
// an integer from 1 to MaxLimit is a 400 naming the parameter.
func Limit(v string) (int, error) {
	if v == "" {
		return DefaultLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxLimit {
		return 0, apierror.Invalid(apierror.InvalidParam{Name: "limit", Reason: "must be an integer between 1 and 100"})
	}
	return n, nil
}

// List is one page of a list endpoint.
type List[T any] struct {
	Object  string `json:"object"` // always "list"
	Data    []T    `json:"data"`
	HasMore bool   `json:"has_more"`
}

// Page makes the page from rows read with limit+1 as their maximum: the
// extra row, when there is one, only tells that more follow.
func Page[R, T any](rows []R, limit int, item func(R) T) List[T] {
	out := List[T]{Object: "list", Data: make([]T, 0, min(len(rows), limit)), HasMore: len(rows) > limit}
	for _, r := range rows[:min(len(rows), limit)] {
		out.Data = append(out.Data, item(r))
	}
	return out
}
