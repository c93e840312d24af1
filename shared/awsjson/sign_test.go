package awsjson_test

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
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/holdfast/holdfast/shared/awsjson"
)

// A request is signed exactly as the SDK's own signer signs it: the same
// Authorization, X-Amz-Date and X-Amz-Security-Token, byte for byte, for
// each API, endpoint, body, credentials (with and without a session token)
// and time, across days (the derived key is kept per day and secret).
func TestSignatureIsTheSDKSignersToTheByte(t *testing.T) {
	at := time.Date(2026, 12, 6, 23, 59, 59, 0, time.UTC)
	for _, api := range []awsjson.API{awsjson.SQS, awsjson.EventBridge} {
		for _, endpoint := range []string{"http://127.0.0.1:4100", "https://sqs.eu-west-1.amazonaws.com", "http://localhost:80", "https://events.example.test:443", "http://127.0.0.1:9/base"} {
			for _, c := range []aws.Credentials{
				{AccessKeyID: "AKID", SecretAccessKey: "secret"},
				{AccessKeyID: "ASIAEXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", SessionToken: "IQoJb3JpZ2luX2VjE//token+with/slashes=="},
				{AccessKeyID: "AKID", SecretAccessKey: "other", SessionToken: "a token  with spaces"},
			} {
				signer := awsjson.NewSigner(api, "eu-west-1", credentials.StaticCredentialsProvider{Value: c})
				for i, payload := range []string{`{}`, `{"QueueUrl":"http://x/q","MessageBody":"` + strings.Repeat("é", 300) + `"}`, ``} {
					when := at.Add(time.Duration(i) * time.Second) // the second crosses midnight
					mine, err := signer.Request(context.Background(), endpoint, "SendMessage", []byte(payload), when)
					if err != nil {
						t.Fatal(err)
					}
					sdk, err := http.NewRequest(http.MethodPost, mine.URL.String(), strings.NewReader(payload))
					if err != nil {
						t.Fatal(err)
					}
					sdk.Header.Set("Content-Type", api.ContentType)
					sdk.Header.Set("X-Amz-Target", api.TargetPrefix+".SendMessage")
					hash := sha256.Sum256([]byte(payload))
					if err := v4.NewSigner().SignHTTP(context.Background(), c, sdk, hex.EncodeToString(hash[:]), api.SigningName, "eu-west-1", when); err != nil {
						t.Fatal(err)
					}
					for _, h := range []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token", "Content-Type", "X-Amz-Target"} {
						if mine.Header.Get(h) != sdk.Header.Get(h) {
							t.Errorf("%s %s %q payload %d: %s\n mine %q\n SDK  %q", api.Name, endpoint, c.SessionToken, i, h, mine.Header.Get(h), sdk.Header.Get(h))
						}
					}
					if mine.Host != sdk.Host {
						t.Errorf("%s %s: Host %q, the SDK's %q", api.Name, endpoint, mine.Host, sdk.Host)
					}
				}
			}
		}
	}
}

// BenchmarkRequest: a SendMessage's request, built and signed.
func BenchmarkRequest(b *testing.B) {
	signer := awsjson.NewSigner(awsjson.SQS, "eu-west-1", aws.NewCredentialsCache(credentials.StaticCredentialsProvider{Value: aws.Credentials{
		AccessKeyID: "ASIAEXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", SessionToken: strings.Repeat("IQoJb3JpZ2luX2VjE", 40)}}))
	payload := []byte(`{"QueueUrl":"https://sqs.eu-west-1.amazonaws.com/123456789012/holdfast-reservations","MessageBody":"` + strings.Repeat("x", 600) + `"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := signer.Request(context.Background(), "https://sqs.eu-west-1.amazonaws.com", "SendMessage", payload, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// alternating hands out a base64 session token and one the SDK's signer
// trims (U+00A0 at its end) in turn, as a refresh racing requests would.
type alternating struct{ n atomic.Int64 }

func (a *alternating) Retrieve(context.Context) (aws.Credentials, error) {
	if a.n.Add(1)%2 == 0 {
		return aws.Credentials{AccessKeyID: "AKID2", SecretAccessKey: "two", SessionToken: "IQoJb3JpZ2lu\u00a0"}, nil
	}
	return aws.Credentials{AccessKeyID: "AKID1", SecretAccessKey: "one", SessionToken: "IQoJb3JpZ2lu+/="}, nil
}

// The signer checks a session token's characters once and keeps the
// answer for that token only: a token it took, then one it must leave to
// the SDK, then the first again, from one signer at the same time, are
// each signed as the SDK signs them.
func TestATokenCheckedOnceIsCheckedAgainWhenItChanges(t *testing.T) {
	signer := awsjson.NewSigner(awsjson.SQS, "eu-west-1", &alternating{})
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				req, err := signer.Request(context.Background(), "http://127.0.0.1:4100", "SendMessage", []byte(`{"a":1}`), at)
				if err != nil {
					t.Error(err)
					return
				}
				c := aws.Credentials{AccessKeyID: "AKID1", SecretAccessKey: "one", SessionToken: "IQoJb3JpZ2lu+/="}
				if strings.HasPrefix(req.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=AKID2/") {
					c = aws.Credentials{AccessKeyID: "AKID2", SecretAccessKey: "two", SessionToken: "IQoJb3JpZ2lu\u00a0"}
				}
				if got, want := req.Header.Get("Authorization"), sdkAuthorization(t, awsjson.SQS, c, req.URL.String(), `{"a":1}`, at); got != want {
					t.Errorf("token %q:\n mine %s\n SDK  %s", c.SessionToken, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}
