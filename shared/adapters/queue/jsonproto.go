package queue

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Signer signs requests of SQS's JSON protocol as the SDK does (Signature
// Version 4, service "sqs").
type Signer struct {
	Region      string
	Credentials aws.CredentialsProvider // cached (LoadDefaultConfig's is)
	v4          *v4.Signer
}

// NewSigner returns a Signer for region with creds.
func NewSigner(region string, creds aws.CredentialsProvider) *Signer {
	return &Signer{Region: region, Credentials: creds, v4: v4.NewSigner()}
}

// Request returns op's request (AmazonSQS.<op>) to endpoint carrying
// payload, signed at the time at.
func (s *Signer) Request(ctx context.Context, endpoint, op string, payload []byte, at time.Time) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS."+op)
	creds, err := s.Credentials.Retrieve(ctx)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	hash := sha256.Sum256(payload)
	if err := s.v4.SignHTTP(ctx, creds, req, hex.EncodeToString(hash[:]), "sqs", s.Region, at); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return req, nil
}

// Refusal reads a refused answer of the JSON protocol: its error type
// without the namespace (QueueDoesNotExist; the status's text if it names
// none) and its message.
func Refusal(status int, body []byte) (code, message string) {
	var e struct {
		Type    string `json:"__type"`
		Message string `json:"message"`
	}
	_ = json.Unmarshal(body, &e)
	code = e.Type[strings.LastIndexByte(e.Type, '#')+1:]
	if code == "" {
		code = http.StatusText(status)
	}
	return code, e.Message
}
