package reservation

// Review 7 of 0700770..HEAD: mac's HMACs from a pool.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"
)

// review7Mac is mac as 0700770 computed it: a fresh HMAC each time.
func review7Mac(secret []byte, purpose string, parts ...string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("holdfast/" + purpose))
	for _, p := range parts {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return h.Sum(nil)
}

// Held: two services with different secrets, used at once from many
// goroutines (interleaving tickets, admissions and checks of forged,
// another buyer's and another service's tokens), compute every MAC as a
// fresh HMAC does: no pooled state leaks between uses or services.
func TestReview7PooledMACsAreFreshOnes(t *testing.T) {
	secrets := [][]byte{[]byte("first-secret-of-the-review-0000"), []byte("second-secret-of-the-review-111"), nil}
	svcs := make([]*Service, len(secrets))
	for i, k := range secrets {
		svcs[i] = NewService(Config{}, Deps{IDSecret: k})
	}
	exp := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 400 {
				k := (g + i) % len(svcs)
				s := svcs[k]
				sku, user := fmt.Sprintf("sku-%d", i%7), fmt.Sprintf("u%d-%d", g, i)
				ticket := s.TicketOf(sku, user)
				want := review7Mac(secrets[k], "ticket", sku, user)
				if ticket != idEncoding.EncodeToString(want[:16]) {
					t.Errorf("ticket of %s/%s differs from a fresh HMAC's", sku, user)
					return
				}
				a := s.admission(sku, user, ticket, exp)
				ms := strconv.FormatInt(exp.UnixMilli(), 10)
				wa := review7Mac(secrets[k], "admission", sku, user, ticket, ms)
				if a.Token != ms+"."+base64.RawURLEncoding.EncodeToString(wa[:16]) {
					t.Errorf("admission differs from a fresh HMAC's")
					return
				}
				if _, _, err := s.admitted(a.Token, sku, user); err != nil {
					t.Errorf("own token refused: %v", err)
					return
				}
				if _, _, err := s.admitted(a.Token, sku, user+"x"); err != ErrAdmissionInvalid {
					t.Errorf("another buyer's token: %v", err)
					return
				}
				if _, _, err := svcs[(k+1)%len(svcs)].admitted(a.Token, sku, user); err != ErrAdmissionInvalid {
					t.Errorf("another secret's token: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}
