package merchanthooks

// SetBeforeSend makes f run before each delivery's check of its lease,
// where a worker that stalls after its claim would stall.
func (s *Service) SetBeforeSend(f func()) { s.beforeSend = f }

// RetryAfter is retryAfter, for its test.
var RetryAfter = retryAfter
