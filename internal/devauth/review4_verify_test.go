package devauth_test

// Review 4 of 9778b96 (Verify parses the compact RS256 JWS itself).

import (
	"strings"
	"testing"
	"time"
)

// encoding/base64 skips "\r" and "\n" even in Strict mode, and the
// signature part is decoded outside the signing input, so a buyer's token
// with line breaks anywhere in its signature still verifies: a string that
// is not a compact JWS (API Gateway's authorizer refuses it), and one of
// unboundedly many distinct strings of one token (each an RSA check; when
// this was found, each also an entry of a cache of verified tokens, since
// removed).
// (Over HTTP/1.1 Go's server refuses a CR and folds a CRLF into a space, so
// the dev gateway does not pass one through today; Verify is the boundary.)
func TestReview4VerifyRejectsLineBreaksInTheSignature(t *testing.T) {
	iss := open(t, t.TempDir())
	v := iss.Verifier()
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(tok, '.') + 10
	for _, variant := range []string{
		tok[:i] + "\n" + tok[i:],
		tok[:i] + "\r\n" + tok[i:],
		tok[:i] + "\r" + tok[i:] + "\n",
		tok[:i] + strings.Repeat("\n", 1000) + tok[i:],
	} {
		if claims, err := v.Verify(variant); err == nil {
			t.Errorf("Verify(%q) = sub %q, want an error: not a compact JWS", variant[i-4:i+6], claims["sub"])
		}
	}
}
