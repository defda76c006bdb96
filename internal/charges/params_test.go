package charges

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// readBody must read exactly what the reader gives, whatever length was
// declared: the declared length only sizes the first buffer.
func TestReadBody(t *testing.T) {
	body := bytes.Repeat([]byte(`{"a":"0123456789"}`), 100) // 1800 bytes
	for _, tc := range []struct {
		name     string
		declared int64
	}{
		{"exact", int64(len(body))},
		{"unknown (chunked)", -1},
		{"zero", 0},
		{"declared too small", 10},
		{"declared too large", int64(len(body)) * 3},
		{"declared over the limit", MaxBodyBytes + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// OneByteReader makes every Read return one byte: the growth path.
			for _, r := range []io.Reader{bytes.NewReader(body), iotest.OneByteReader(bytes.NewReader(body))} {
				got, err := readBody(r, tc.declared)
				if err != nil || !bytes.Equal(got, body) {
					t.Fatalf("readBody = %d bytes, %v; want the %d bytes of the body", len(got), err, len(body))
				}
			}
		})
	}
	if got, err := readBody(bytes.NewReader(nil), 0); err != nil || len(got) != 0 {
		t.Fatalf("empty body: %q, %v", got, err)
	}
	boom := errors.New("boom")
	if _, err := readBody(iotest.ErrReader(boom), 10); !errors.Is(err, boom) {
		t.Fatalf("reader error: got %v, want %v", err, boom)
	}
}

func TestReadBodyAllocatesOnceForADeclaredLength(t *testing.T) {
	body := []byte(`{"amount":1000,"currency":"usd","payment_method":"pm_card_visa"}`)
	r := bytes.NewReader(body)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(body)
		if _, err := readBody(r, int64(len(body))); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Fatalf("readBody allocated %.0f times for a body of declared length; want 1", allocs)
	}
}
