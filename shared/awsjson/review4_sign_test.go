package awsjson_test

// Review 4 of 2efff70 (Signature Version 4 signed by hand for a POST to /).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/holdfast/holdfast/shared/awsjson"
)

func sdkAuthorization(t *testing.T, api awsjson.API, c aws.Credentials, url, payload string, at time.Time) string {
	t.Helper()
	sdk, err := http.NewRequest(http.MethodPost, url, strings.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	sdk.Header.Set("Content-Type", api.ContentType)
	sdk.Header.Set("X-Amz-Target", api.TargetPrefix+".SendMessage")
	hash := sha256.Sum256([]byte(payload))
	if err := v4.NewSigner().SignHTTP(context.Background(), c, sdk, hex.EncodeToString(hash[:]), api.SigningName, "eu-west-1", at); err != nil {
		t.Fatal(err)
	}
	return sdk.Header.Get("Authorization")
}

// canSign sends a session token to the hand signer unless it holds " ",
// "\t" or "\n"; the SDK canonicalizes a header value with strings.TrimSpace,
// which also trims "\r", "\v", "\f", U+0085 and U+00A0 at either end. The
// last two are bytes an HTTP request carries (the send happens), so such a
// token is signed other than the SDK signs it: the signature the service
// checks differs.
func TestReview4SessionTokenWithUnicodeSpaceIsSignedAsTheSDKDoes(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tok := range []string{"token\u00a0", "\u0085token", "token\r", "token\v", "\ftoken"} {
		c := aws.Credentials{AccessKeyID: "AKID", SecretAccessKey: "secret", SessionToken: tok}
		signer := awsjson.NewSigner(awsjson.SQS, "eu-west-1", staticCreds{c})
		mine, err := signer.Request(context.Background(), "http://127.0.0.1:4100", "SendMessage", []byte(`{}`), at)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := mine.Header.Get("Authorization"), sdkAuthorization(t, awsjson.SQS, c, mine.URL.String(), `{}`, at); got != want {
			t.Errorf("token %q:\n mine %s\n SDK  %s", tok, got, want)
		}
	}
}

type staticCreds struct{ c aws.Credentials }

func (s staticCreds) Retrieve(context.Context) (aws.Credentials, error) { return s.c, nil }

// rotating hands out one of two secrets in turn (a credential refresh
// racing requests): each request is signed with the secret it retrieved.
type rotating struct{ n atomic.Int64 }

func (r *rotating) Retrieve(context.Context) (aws.Credentials, error) {
	if r.n.Add(1)%2 == 0 {
		return aws.Credentials{AccessKeyID: "AKID2", SecretAccessKey: "two", SessionToken: "t2"}, nil
	}
	return aws.Credentials{AccessKeyID: "AKID1", SecretAccessKey: "one", SessionToken: "t1"}, nil
}

// Held: concurrent requests with rotating credentials across midnight each
// carry the SDK's signature for the credentials they name.
func TestReview4RotatingCredentialsConcurrently(t *testing.T) {
	signer := awsjson.NewSigner(awsjson.EventBridge, "eu-west-1", &rotating{})
	base := time.Date(2026, 12, 6, 23, 59, 58, 0, time.UTC)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				at := base.Add(time.Duration((g+i)%5) * time.Second)
				req, err := signer.Request(context.Background(), "http://127.0.0.1:4100", "SendMessage", []byte(`{"a":1}`), at)
				if err != nil {
					t.Error(err)
					return
				}
				c := aws.Credentials{AccessKeyID: "AKID1", SecretAccessKey: "one", SessionToken: "t1"}
				if req.Header.Get("X-Amz-Security-Token") == "t2" {
					c = aws.Credentials{AccessKeyID: "AKID2", SecretAccessKey: "two", SessionToken: "t2"}
				}
				if got, want := req.Header.Get("Authorization"), sdkAuthorization(t, awsjson.EventBridge, c, req.URL.String(), `{"a":1}`, at); got != want {
					t.Errorf("%s\n SDK %s", got, want)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}
