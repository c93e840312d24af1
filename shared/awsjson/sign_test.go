package awsjson_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
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
