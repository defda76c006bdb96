package merchanthooks

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// SecretPrefix starts every signing secret; the rest is the base64 of the
// key's bytes, as Standard Webhooks defines it.
const SecretPrefix = "whsec_"

// newSecret makes a signing secret: 32 random bytes.
// newID is a new object id: prefix and 128 random bits in hex
// (crypto/rand.Read never fails: it ends the program instead).
func newID(prefix string) string {
	raw := make([]byte, 16)
	_, _ = rand.Read(raw)
	return prefix + hex.EncodeToString(raw)
}

func newSecret() (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("generating a signing secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(raw), nil
}

// sealer seals the signing secrets at rest. A signing secret must be
// usable to sign, so it cannot be kept as the API keys are (only a hash);
// it is encrypted under a key the server holds outside the database
// (WEBHOOK_SECRETS_KEY), with the endpoint's id as associated data, so that
// a sealed secret copied onto another endpoint's row does not open.
type sealer struct{ aead cipher.AEAD }

// errNoSecretsKey: webhooks out are not configured.
var errNoSecretsKey = errors.New("WEBHOOK_SECRETS_KEY is not set: webhook endpoints cannot be created or signed for")

func newSealer(key []byte) (*sealer, error) {
	if len(key) == 0 {
		return nil, errNoSecretsKey
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("WEBHOOK_SECRETS_KEY: %w (want 32 bytes, base64)", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

func (s *sealer) seal(endpointID, secret string) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("sealing a signing secret: %w", err)
	}
	return s.aead.Seal(nonce, nonce, []byte(secret), []byte(endpointID)), nil
}

func (s *sealer) open(endpointID string, sealed []byte) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return "", errors.New("sealed signing secret too short")
	}
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(endpointID))
	if err != nil {
		return "", fmt.Errorf("opening the signing secret of %s (is WEBHOOK_SECRETS_KEY the one it was sealed with?): %w", endpointID, err)
	}
	return string(plain), nil
}

// Sign is the webhook-signature header of one delivery: "v1,<base64
// HMAC-SHA256 of id.timestamp.body>" under each secret, space-separated (a
// rotation signs with the new and the previous secret). The signatures are
// made by the Standard Webhooks reference library, so that they are what
// every receiver's library verifies.
func Sign(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return "", fmt.Errorf("signing secret: %w", err)
		}
		sig, err := wh.Sign(id, ts, body)
		if err != nil {
			return "", fmt.Errorf("signing %s: %w", id, err)
		}
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " "), nil
}
