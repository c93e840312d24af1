package awsjson_test

// Review 7 of 0700770..HEAD: sign in one pooled buffer, pooled day-key
// HMACs, the session token's check cached.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/holdfast/holdfast/shared/awsjson"
)

type ctxCredsKey struct{}

// ctxCreds hands out the credentials the request's context carries: one
// signer, each concurrent request with its own credentials.
type ctxCreds struct{}

func (ctxCreds) Retrieve(ctx context.Context) (aws.Credentials, error) {
	return ctx.Value(ctxCredsKey{}).(aws.Credentials), nil
}

func review7RandString(r *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

const review7B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-"

// Held (a differential check): concurrent requests through one signer,
// each with random credentials (tokens and access key ids long enough to
// grow the pooled buffer at every step, empty tokens), random bodies
// (empty too), endpoints (ports, IPv6, case, userinfo) and times across
// day boundaries, carry the SDK's Authorization, X-Amz-Date and token.
func TestReview7RandomRequestsAreTheSDKsToTheByte(t *testing.T) {
	endpoints := []string{"http://127.0.0.1:4100", "https://sqs.eu-west-1.amazonaws.com", "http://[::1]:4100", "HTTP://LocalHost:8080",
		"http://user:pw@127.0.0.1:4100", "https://127.0.0.1:0443", "http://127.0.0.1:", "https://Events.Example.Test:8443", "http://localhost:80", "https://x:443"}
	base := time.Date(2026, 12, 6, 23, 59, 50, 0, time.UTC)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			signers := []*awsjson.Signer{awsjson.NewSigner(awsjson.SQS, "eu-west-1", ctxCreds{}), awsjson.NewSigner(awsjson.EventBridge, "eu-west-1", ctxCreds{})}
			apis := []awsjson.API{awsjson.SQS, awsjson.EventBridge}
			for i := range 600 {
				k := r.IntN(2)
				lens := []int{0, 1, 20, 700, 1900, 2100, 4000}
				secret := review7RandString(r, "ab", 1+r.IntN(2)) // few secrets: the day key is reused and replaced
				c := aws.Credentials{
					// The SDK's own signer caches a day's key by access key id
					// (not secret): one id per secret here.
					AccessKeyID:     "AK" + secret + review7RandString(r, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", lens[r.IntN(len(lens))]),
					SecretAccessKey: secret,
					SessionToken:    review7RandString(r, review7B64, lens[r.IntN(len(lens))]),
				}
				if r.IntN(4) == 0 {
					c.SessionToken = "tok" // a token seen before
				}
				payload := review7RandString(r, "abc\"{}é", lens[r.IntN(len(lens))])
				at := base.Add(time.Duration(r.IntN(40)) * time.Second).Add(time.Duration(r.IntN(3)) * 24 * time.Hour)
				if r.IntN(10) == 0 {
					at = at.In(time.FixedZone("x", -11*3600))
				}
				ep := endpoints[r.IntN(len(endpoints))]
				ctx := context.WithValue(context.Background(), ctxCredsKey{}, c)
				mine, err := signers[k].Request(ctx, ep, "SendMessage", []byte(payload), at)
				if err != nil {
					t.Error(err)
					return
				}
				sdk, err := http.NewRequest(http.MethodPost, mine.URL.String(), strings.NewReader(payload))
				if err != nil {
					t.Error(err)
					return
				}
				sdk.Header.Set("Content-Type", apis[k].ContentType)
				sdk.Header.Set("X-Amz-Target", apis[k].TargetPrefix+".SendMessage")
				h := sha256.Sum256([]byte(payload))
				if err := v4.NewSigner().SignHTTP(context.Background(), c, sdk, hex.EncodeToString(h[:]), apis[k].SigningName, "eu-west-1", at); err != nil {
					t.Error(err)
					return
				}
				for _, name := range []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token", "Content-Type", "X-Amz-Target"} {
					if mine.Header.Get(name) != sdk.Header.Get(name) {
						t.Errorf("case %d/%d %s: %s\n mine %.200q\n SDK  %.200q", g, i, ep, name, mine.Header.Get(name), sdk.Header.Get(name))
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
