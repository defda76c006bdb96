package charges

import "context"

// InspectedBody is the stored answer that GET /v1/idempotency_keys/{key}
// reads of the account's record under key (nil when it reads none), for a
// test that checks it reads one only where ActedOn needs it.
func (s *Service) InspectedBody(ctx context.Context, accountID, key string) ([]byte, error) {
	row, err := s.st.keyState(ctx, accountID, key)
	return row.ResponseBody, err
}
